"""The landing page at `/`, an on-call screen: first, for each model, the fleet's hit ratio
now over the window that pages, the cause and the culprit in words, and the chart with axes
(core/story.py's words, as the page and `status` say them); after them the targets, tiers,
KV streams, ledger and per-target charts (exporter/charts.py draws them), in one HTML page
that fits 1280 pixels.

Kept apart from the HTTP server so the page can grow without touching the serving code.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from prefixwatch.core.cache.requestledger import table as ledger_table
from prefixwatch.core.cache.whatvaries import FIXES
from prefixwatch.core.kv.eventledger import event_table
from prefixwatch.core.story import Culprit, percent
from prefixwatch.core.version import __version__
from prefixwatch.core.vocab import exposition, rulenames, settings, tiers
from prefixwatch.exporter.chartbins import BINS, SPAN_SECONDS, Binned, bin_history, choose_width
from prefixwatch.exporter.charts import Chart, ChartCache
from prefixwatch.exporter.evidence import served_tokens
from prefixwatch.exporter.monitor import WindowFigures
from prefixwatch.exporter.pagereader import CACHED
from prefixwatch.exporter.status import LEDGER_NEEDS_LOG, ratio_name, tier_shares

if TYPE_CHECKING:
    from prefixwatch.exporter.service import Exporter


def render_landing(exporter: Exporter) -> str:
    """Render the landing page from the exporter's current state."""
    config = exporter.config
    window = config.windows[0] if config.windows else None
    rows = []
    for mon in exporter.monitors:
        with mon.lock:
            state = "up" if mon.up else ("not polled yet" if not mon.polled else "down")
            schema = mon.snapshot.schema.schema if mon.snapshot and mon.up else ""
            # Over a limit, the page was read but series were left out: say which.
            error = mon.last_error if not mon.up else (
                f"limit reached: {mon.limit_note} (docs/configuration.md#limits)"
                if mon.limit_note else "")
            ratios = ", ".join(
                f"{m}: {wf.hit_ratio:.1%} ({window})"
                + ("" if wf.effective_ratio is None else f", effective {wf.effective_ratio:.1%}")
                for m, f in sorted(mon.models.items())
                if (wf := f.windows.get(window or "")) is not None and wf.hit_ratio is not None)
        with exporter.state.lock:
            causes = "; ".join(
                f"{model}: {', '.join(exporter.state.diagnosis.active(mon.name, model)) or '-'}"
                for (target, model) in sorted(exporter.state.diagnosis.causes)
                if target == mon.name) if mon.up else ""
        rows.append(_row((mon.name, mon.target.display_url, state, schema, ratios, causes,
                          error)))
    now = time.time()
    fleet, per_target = charts(exporter, now)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>prefixwatch</title>"
        "<meta http-equiv='refresh' content='15'>"
        "<style>body{font-family:sans-serif;max-width:1264px;margin:8px 12px}"
        "td,th{padding:2px 10px;text-align:left}" + CSS +
        "</style>"
        f"</head><body><div class='top'><b>prefixwatch {__version__}</b> &middot; "
        "<a href='/metrics'>/metrics</a> &middot; <a href='/healthz'>/healthz</a> &middot; "
        "this page refreshes itself every 15 s</div>"
        + story_section(exporter, fleet)
        + "<h2>Targets</h2>"
        "<table class='targets'><tr><th>target</th><th>url</th><th>state</th><th>schema</th>"
        f"<th>hit ratio ({html.escape(str(window))}; device, effective)</th>"
        "<th>diagnosis (docs/runbooks.md#diagnosis)</th>"
        "<th>last error</th></tr>" + "".join(rows) + "</table>"
        + per_target
        + tier_section(exporter, window) + kv_section(exporter)
        + ledger_section(exporter, window)
        + "</body></html>")


def story_window(exporter: Exporter) -> str | None:
    """The window the landing page's headline is over: the one the critical alert pages on
    when the exporter computes it, else its first (the demo puts the scaled paging window
    first)."""
    windows = exporter.config.windows
    if settings.CRITICAL_SHORT_WINDOW in windows:
        return settings.CRITICAL_SHORT_WINDOW
    return windows[0] if windows else None


def fleet_ratio(exporter: Exporter, model: str, window: str) -> float | None:
    """The model's ratio over ``window``, every up target's tokens summed before dividing
    (the ratio the alerts judge: effective or device)."""
    figures = []
    for mon in exporter.monitors:
        with mon.lock:
            if not mon.up or model not in mon.models:
                continue
            wf = mon.models[model].windows.get(window)
            if wf is not None:
                figures.append(wf)
    if not figures:
        return None
    total = WindowFigures.summed(figures)
    return (total.hit_ratio if exporter.config.hit_ratio_mode == settings.HIT_RATIO_DEVICE
            else total.effective_ratio)


def story_section(exporter: Exporter, fleet: dict[str, Chart]) -> str:
    """The answer first: per model, the fleet's ratio now, its cause and culprit, and the
    chart with axes."""
    window = story_window(exporter)
    threshold = exporter.config.thresholds.hit_ratio
    with exporter.state.lock:
        active = {key: exporter.state.diagnosis.active(*key)
                  for key in exporter.state.diagnosis.causes}
        culprits = dict(exporter.state.culprits)
    models = sorted(set(fleet) | {m for _t, m in active})
    if not models:
        return ("<div class='story'><p class='big'>no traffic yet</p><p>The hit ratio "
                "appears after the first polls with traffic.</p></div>")
    out = []
    name = ratio_name(exporter.config.hit_ratio_mode)
    for model in models:
        value = fleet_ratio(exporter, model, window) if window else None
        causes = sorted({c for (_t, m), cs in active.items() if m == model for c in cs})
        out.append(_story(model, value, window, name, threshold, causes, culprits.get(model),
                          fleet.get(model)))
    return "".join(out)


def _story(model: str, value: float | None, window: str | None, name: str, threshold: float,
           causes: list[str], culprit: Culprit | None, chart: Chart | None) -> str:
    esc = html.escape
    low = value is not None and value < threshold
    cls = "low" if low else "ok" if value is not None else ""
    said = ", ".join(f"<a href='{RUNBOOK}#{esc(c)}'>{esc(c)}</a>" for c in causes) or (
        "none diagnosed")
    lines = [f"<div class='story'><div class='headline'><span class='big {cls}'>"
             f"{esc(percent(value)) if value is not None else 'no traffic'}</span> "
             f"<span class='what'>fleet {esc(name)} of <b>{esc(model)}</b> over "
             f"{esc(str(window))} (alert threshold {threshold:.0%})</span></div>",
             f"<p class='cause'>cause: {said}</p>"]
    if culprit is not None:
        lines.append(f"<p class='culprit'>culprit: {esc(culprit.words)}</p>")
        if culprit.kind in FIXES:
            lines.append(f"<p class='fix'>fix: {esc(FIXES[culprit.kind])}</p>")
    if chart is not None:
        lines.append(chart.svg_with_axes(threshold, f"fleet: {model}"))
        lines.append(LEGEND.format(name=esc(name), threshold=f"{threshold:.0%}",
                                   span=_duration(chart.binned.end - chart.binned.start)))
    return "".join(lines) + "</div>"


RUNBOOK = rulenames.DEFAULT_RUNBOOK_URL
LEGEND = ('<p class="legend"><span style="color:#08519c">&#9644; {name}</span> (left scale) '
          '&middot; <span style="color:#d62728">- - threshold {threshold}</span> &middot; '
          '<span style="color:#f16913">&#9644; TTFT p50</span> (right scale) &middot; the last '
          "{span}</p>")


def _row(cells) -> str:
    return "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def _table(cls: str, head, rows: list[str]) -> str:
    """A table of ``rows`` under a header row of ``head``; empty without rows."""
    if not rows:
        return ""
    return (f"<table class='{cls}'><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"
            + "".join(rows) + "</table>")


def tier_section(exporter: Exporter, window: str | None) -> str:
    """A table of each target's prompt tokens by the cache tier that served them over the
    first window (docs/tiers.md): the device ratio alone misses what a host tier saves."""
    tier_names = (*tiers.TIERS, "recomputed")  # tier_shares' keys
    rows = []
    for mon in exporter.monitors:
        with mon.lock:
            if not mon.up:
                continue
            for model, figures in sorted(mon.models.items()):
                wf = figures.windows.get(window or "")
                shares = tier_shares(wf.tiers, wf.queries) if wf is not None else None
                if shares is None:
                    continue
                effective = wf.effective_ratio
                rows.append(_row([mon.name, model, *(f"{shares[t]:.1%}" for t in tier_names),
                                  "-" if effective is None else f"{effective:.1%}"]))
    table = _table("tiers", ("target", "model", *tier_names, "effective"), rows)
    return table and (f"<h2>Prompt tokens by cache tier ({html.escape(str(window))}, "
                      "docs/tiers.md)</h2>" + table)


def ledger_section(exporter: Exporter, window: str | None) -> str:
    """Where the window's prompt tokens went (core/cache/requestledger.py), or that it needs a
    request log."""
    events = event_ledger_section(exporter, window)
    if events:
        return events
    view = exporter.view
    if view is None:
        return f"<p>{html.escape(LEDGER_NEEDS_LOG)}</p>"
    seconds = exporter.config.window_seconds.get(window or "", exporter.diag_seconds)
    parts, unmeasured = view.ledger_window(seconds)
    if not parts.requests:
        return "<p>Ledger: no logged request in the window yet.</p>"
    achieved = parts.achieved
    if achieved is None:
        achieved = served_tokens(exporter.monitors, window or "")
    lines = ledger_table(parts, achieved, unmeasured)
    return (f"<h2>Where the prompt tokens went ({html.escape(str(window))}, "
            "docs/runbooks.md#the-hit-rate-ledger)</h2><pre>"
            + html.escape("\n".join(lines)) + "</pre>")


def kv_section(exporter: Exporter) -> str:
    """Each KV event stream: connected, what it held and stored, what was lost or refused."""
    rows = []
    for source in exporter.kv.all_sources():
        up, lost, errors, snap = source.read()
        refused = ", ".join(f"{r} {n}" for r, n in sorted(errors.items()) if n) or "-"
        stored, resident = ((", ".join(f"{m} {n:,}" for m, n in sorted(c.items()))
                             for c in (snap.stored, snap.resident)) if snap else ("-", "-"))
        cells = (source.target, "up" if up else "down", f"{source.messages:,}", stored,
                 resident, f"{lost:,}", refused)
        rows.append(_row(cells))
    table = _table("kv", ("target", "stream", "messages", "blocks stored", "resident", "lost",
                          "not used (reason count)"), rows)
    seen = sorted({r for source in exporter.kv.all_sources()
                   for r, n in source.read()[2].items() if n})
    meanings = "".join(f"<li><code>{html.escape(r)}</code>: "
                       f"{html.escape(exposition.KV_ERROR_MEANINGS.get(r, ''))}</li>" for r in seen)
    return table and ("<h2>KV event streams (docs/kv-events.md)</h2>" + table
                      + "<p class='legend'>messages: received; blocks stored: by medium; "
                        "resident: held now; lost: messages missed (sequence gaps)."
                      + (f"</p><ul class='legend'>{meanings}</ul>" if meanings else "</p>"))


def event_ledger_section(exporter: Exporter, window: str | None) -> str:
    """The ledger from the KV event streams, per model (the targets summed) and per target;
    empty when no target's stream has spoken."""
    ledgers = exporter.kv_ledgers
    models = ledgers.models()
    if not models:
        return ""
    seconds = exporter.config.window_seconds.get(window or "", exporter.diag_seconds)
    out = [f"<h2>Where the prompt tokens went ({html.escape(str(window))}, from the KV event "
           "streams; docs/runbooks.md#the-hit-rate-ledger)</h2>"]
    for model, targets in sorted(models.items()):
        spans = [(model, ledgers.model_span(model, seconds))]
        if len(targets) > 1:
            spans += [(f"{t}", ledgers.span(t, seconds)) for t in sorted(targets)]
        for title, span in spans:
            if span is None or span.prompt <= 0:
                out.append(f"<p>{html.escape(title)}: no prompt tokens in the window yet.</p>")
                continue
            lines = event_table(span.shares, span.prompt)
            out.append(f"<h3>{html.escape(title)}</h3><pre>"
                       + html.escape("\n".join(lines)) + "</pre>")
    return "".join(out)


def _duration(seconds: float) -> str:
    """A chart's span or step in words, rounded as a person reads a clock."""
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.3g} s"


def charts_section(exporter: Exporter, now: float, cached: bool = True) -> str:
    """Each target's chart card, with its diagnosis. ``cached=False`` draws everything from
    scratch (the reference the cache must match)."""
    return charts(exporter, now, cached)[1]


def charts(exporter: Exporter, now: float, cached: bool = True
           ) -> tuple[dict[str, Chart], str]:
    """Each model's fleet chart (the headline draws it with axes), and each target's card."""
    threshold = exporter.config.thresholds.hit_ratio
    cache = exporter.charts
    with cache.lock:
        return _section(exporter, now, threshold, cache if cached else None)


def _section(exporter: Exporter, now: float, threshold: float, cache: ChartCache | None
             ) -> tuple[dict[str, Chart], str]:
    latest = max((m.last_success for m in exporter.monitors if m.last_success == m.last_success),
                 default=now)
    oldest = latest
    plan: tuple[tuple[float, float], ...] = ()
    for mon in exporter.monitors:
        with mon.lock:
            for state in mon.series.values():
                if state.history is not None:
                    held = state.history.held(-1)
                    plan = plan or state.history.tier_plan()
                    if held is not None:
                        oldest = min(oldest, held[0])
    width = choose_width(plan, latest - oldest) if plan else SPAN_SECONDS / BINS
    if cache is not None and cache.width != width:
        cache.entries.clear()
        cache.width = width
    seen: set[tuple[str, str]] = set()
    per_target: list[tuple[str, str, Chart]] = []
    fleet: dict[str, Binned] = {}
    for mon in exporter.monitors:
        with mon.lock:
            if not mon.up:
                continue
            by_model = {m: [s.history for s in states if s.history is not None]
                        for m, states in mon.by_model().items()}
            by_model = {m: h for m, h in by_model.items() if h}
            if cache is None:
                charts = {m: Chart.of(bin_history(h, latest, width, exporter.charts.served))
                          for m, h in by_model.items()}
            else:
                charts = {m: cache.chart((mon.name, m), h, latest, width)
                          for m, h in by_model.items()}
                seen.update((mon.name, m) for m in by_model)
        for model, chart in sorted(charts.items()):
            per_target.append((mon.name, model, chart))
            b = chart.binned
            if model in fleet:
                fleet[model].add(b)
            else:
                fleet[model] = Binned(b.start, b.end, b.rows.copy(), b.ttft_bounds)
    if cache is not None:
        for key in set(cache.entries) - seen:
            del cache.entries[key]
    with exporter.state.lock:
        active = {key: exporter.state.diagnosis.active(*key)
                  for key in exporter.state.diagnosis.causes}
    ratio = "effective hit ratio" if exporter.charts.served == CACHED else "device hit ratio"
    out = [f'<h2>Each target over time</h2><p class="legend"><span style="color:#08519c">'
           f'&#9644; {ratio}</span> (0-100%) &middot; <span style="color:#d62728">- - threshold '
           f'{threshold:.0%}</span> &middot; <span style="color:#f16913">&#9644; TTFT p50'
           f"</span> (own scale) &middot; the last {_duration(width * BINS)}, one point per "
           f"{_duration(width)}</p>"]
    out.append('<div class="cards">')
    for target, model, chart in per_target:
        out.append(_card(target, model, chart, threshold, active.get((target, model), [])))
    out.append("</div>")
    return {model: Chart.of(b) for model, b in fleet.items()}, "".join(out)


def _card(target: str, model: str, chart: Chart, threshold: float, causes: list[str],
          fleet: bool = False) -> str:
    esc = html.escape
    now = chart.current()
    low = now is not None and now < threshold
    title = f"{'fleet' if fleet else target}: {model}"
    diagnosis = ", ".join(causes) if causes else "no cause holds"
    return (f'<div class="card{" fleet" if fleet else ""}"><div class="head">'
            f"<b>{esc(target)}</b> &middot; {esc(model)} &middot; "
            f'<span class="{"low" if low else "ok"}">'
            f'{"no traffic" if now is None else f"{now:.1%}"}</span></div>'
            f"{chart.svg(threshold, title)}"
            f'<div class="diag">diagnosis: {esc(diagnosis)}</div></div>')


#: The charts' cards (exporter/charts.py), laid out to fill a 1280-pixel window; a long URL or
#: error wraps inside its column rather than widening the page.
CSS = (".top{color:#555;font-size:13px;margin-bottom:6px}.story{margin-bottom:8px}"
       ".headline .big{font-size:44px;font-weight:bold;margin-right:10px}"
       ".headline .what{font-size:17px}.story p{margin:3px 0;font-size:16px}"
       ".story .culprit{font-size:18px;font-weight:bold}.fix{color:#333}"
       "svg .axis{font-size:11px;fill:#444}h2{font-size:20px;margin:14px 0 6px}"
       "table{max-width:100%}.targets td:nth-child(2),.targets td:last-child{max-width:300px;"
       "word-break:break-all}"
       ".cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #ddd;padding:6px;"
       "width:362px;font-size:13px}.card.fleet{display:inline-block;margin:0 10px 10px 0}"
       ".card .head{margin-bottom:4px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}"
       ".low{color:#d62728;font-weight:bold}.ok{color:#2ca02c;font-weight:bold}"
       ".diag{color:#555;margin-top:2px}.legend{color:#444;font-size:13px}"
       "svg .ttft{font-size:10px;fill:#a63603}")
