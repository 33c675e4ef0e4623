"""The landing page at `/`, an on-call screen: first, for each model, the fleet's hit ratio
now over the window that pages, the cause and the culprit in words, and the chart with axes
(core/story.py's words, as the page and `status` say them); after them the targets, each
target's chart, tiers, KV streams and ledger (exporter/charts.py draws the charts), in one HTML
page that fits 1280 pixels.

Kept apart from the HTTP server so the page can grow without touching the serving code.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prefixwatch.core.cache.requestledger import table as ledger_table
from prefixwatch.core.cache.whatvaries import FIXES
from prefixwatch.core.diagnosis import Diagnosis
from prefixwatch.core.kv.eventledger import event_table
from prefixwatch.core.kv.ladder import ladder
from prefixwatch.core.kv.ladder import lines as ladder_lines
from prefixwatch.core.story import Culprit, percent, ratio_name
from prefixwatch.core.version import __version__
from prefixwatch.core.vocab import exposition, rulenames, settings, tiers
from prefixwatch.exporter.chartbins import BINS, SPAN_SECONDS, Binned, bin_history, choose_width
from prefixwatch.exporter.charts import Chart, ChartCache
from prefixwatch.exporter.config import ExporterConfig
from prefixwatch.exporter.evidence import LEDGER_NEEDS_LOG, served_tokens
from prefixwatch.exporter.kvsubscriber import StreamView
from prefixwatch.exporter.kvsubscriber.ledgerseries import EventLedgers
from prefixwatch.exporter.monitor import TargetView, WindowFigures
from prefixwatch.exporter.pagereader import CACHED
from prefixwatch.exporter.poolchart import pool_section
from prefixwatch.exporter.requestlog.view import RequestView


@dataclass(frozen=True)
class LandingInputs:
    """What the landing page reads, taken once per request: each target's view, each KV
    stream's, the latest diagnosis, and the parts that answer for themselves (the event
    ledgers, the request view, the chart cache)."""

    config: ExporterConfig
    targets: tuple[TargetView, ...]
    diagnosis: Diagnosis
    #: The diagnosis' window in seconds (the ledger's window when the first is no window).
    diag_seconds: float
    charts: ChartCache
    streams: tuple[StreamView, ...] = ()
    event_ledgers: EventLedgers | None = None
    requests: RequestView | None = None
    #: Each model's culprit (core/story.py), read-only.
    culprits: Mapping[str, Culprit] = field(default_factory=lambda: MappingProxyType({}))


def render_landing(page: LandingInputs) -> str:
    """Render the landing page from what it reads."""
    config = page.config
    window = config.windows[0] if config.windows else None
    rows = []
    for view in page.targets:
        state = "up" if view.up else ("not polled yet" if not view.polled else "down")
        schema = view.schema.schema if view.schema and view.up else (
            f"router ({view.router.kind})" if view.router is not None and view.up else "")
        # Over a limit, the page was read but series were left out: say which.
        error = view.last_error if not view.up else (
            f"limit reached: {view.limit_note} (docs/configuration.md#limits)"
            if view.limit_note else "")
        ratios = ", ".join(
            f"{m}: {wf.hit_ratio:.1%} ({window})"
            + ("" if wf.effective_ratio is None else f", effective {wf.effective_ratio:.1%}")
            for m, f in sorted(view.models.items())
            if (wf := f.windows.get(window or "")) is not None and wf.hit_ratio is not None)
        causes = "; ".join(
            f"{model}: {', '.join(page.diagnosis.active(view.name, model)) or '-'}"
            for (target, model) in sorted(page.diagnosis.causes)
            if target == view.name) if view.up else ""
        rows.append(_row((view.name, view.target.display_url, state, schema, ratios, causes,
                          error)))
    fleet, per_target = charts(page, time.time())
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>prefixwatch</title>"
        "<meta http-equiv='refresh' content='15'>"
        "<style>body{font-family:sans-serif;max-width:1264px;margin:8px 12px}"
        "td,th{padding:2px 10px;text-align:left}" + CSS +
        "</style>"
        f"</head><body><div class='top'><b>prefixwatch {__version__}</b> &middot; "
        "<a href='/metrics'>/metrics</a> &middot; <a href='/healthz'>/healthz</a> &middot; "
        "this page refreshes itself every 15 s</div>"
        + story_section(page, fleet)
        + "<h2>Targets</h2>"
        "<table class='targets'><tr><th>target</th><th>url</th><th>state</th><th>schema</th>"
        f"<th>hit ratio ({html.escape(str(window))}; device, effective)</th>"
        "<th>diagnosis (docs/runbooks.md#diagnosis)</th>"
        "<th>last error</th></tr>" + "".join(rows) + "</table>"
        + per_target
        + tier_section(page, window) + kv_section(page)
        + ledger_section(page, window) + pool_section(page, window)
        + "</body></html>")


def story_window(config: ExporterConfig) -> str | None:
    """The window the landing page's headline is over: the one the critical alert pages on
    when the exporter computes it, else its first (the demo puts the scaled paging window
    first)."""
    if settings.CRITICAL_SHORT_WINDOW in config.windows:
        return settings.CRITICAL_SHORT_WINDOW
    return config.windows[0] if config.windows else None


def fleet_ratio(page: LandingInputs, model: str, window: str) -> float | None:
    """The model's ratio over ``window``, every up target's tokens summed before dividing
    (the ratio the alerts judge: effective or device)."""
    figures = [wf for view in page.targets if view.up and model in view.models
               if (wf := view.models[model].windows.get(window)) is not None]
    if not figures:
        return None
    total = WindowFigures.summed(figures)
    return (total.hit_ratio if page.config.hit_ratio_mode == settings.HIT_RATIO_DEVICE
            else total.effective_ratio)


def story_section(page: LandingInputs, fleet: dict[str, Chart]) -> str:
    """The answer first: per model, the fleet's ratio now, its cause and culprit, and the
    chart with axes."""
    window = story_window(page.config)
    threshold = page.config.thresholds.hit_ratio
    active = {key: page.diagnosis.active(*key) for key in page.diagnosis.causes}
    models = sorted(set(fleet) | {m for _t, m in active})
    if not models:
        return ("<div class='story'><p class='big'>no traffic yet</p><p>The hit ratio "
                "appears after the first polls with traffic.</p></div>")
    name = ratio_name(page.config.hit_ratio_mode)
    return "".join(
        _story(model, fleet_ratio(page, model, window) if window else None, window, name,
               threshold, sorted({c for (_t, m), cs in active.items() if m == model
                                  for c in cs}), page.culprits.get(model), fleet.get(model))
        for model in models)


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


def tier_section(page: LandingInputs, window: str | None) -> str:
    """A table of each target's prompt tokens by the cache tier that served them over the
    first window (docs/tiers.md): the device ratio alone misses what a host tier saves."""
    tier_names = (*tiers.TIERS, "recomputed")  # tier_shares' keys
    rows = []
    for view in page.targets:
        if not view.up:
            continue
        for model, figures in sorted(view.models.items()):
            wf = figures.windows.get(window or "")
            shares = wf.tier_shares() if wf is not None else None
            if shares is None:
                continue
            effective = wf.effective_ratio
            rows.append(_row([view.name, model, *(f"{shares[t]:.1%}" for t in tier_names),
                              "-" if effective is None else f"{effective:.1%}"]))
    table = _table("tiers", ("target", "model", *tier_names, "effective"), rows)
    return table and (f"<h2>Prompt tokens by cache tier ({html.escape(str(window))}, "
                      "docs/tiers.md)</h2>" + table)


def ledger_section(page: LandingInputs, window: str | None) -> str:
    """Where the window's prompt tokens went (core/cache/requestledger.py), or that it needs a
    request log."""
    events = event_ledger_section(page, window)
    if events:
        return events
    view = page.requests
    if view is None:
        return f"<p>{html.escape(LEDGER_NEEDS_LOG)}</p>"
    seconds = page.config.window_seconds.get(window or "", page.diag_seconds)
    parts, unmeasured = view.ledger_window(seconds)
    if not parts.requests:
        return "<p>Ledger: no logged request in the window yet.</p>"
    achieved = parts.achieved
    if achieved is None:
        achieved = served_tokens(page.targets, window or "")
    lines = ledger_table(parts, achieved, unmeasured)
    return (f"<h2>Where the prompt tokens went ({html.escape(str(window))}, "
            "docs/runbooks.md#the-hit-rate-ledger)</h2><pre>"
            + html.escape("\n".join(lines)) + "</pre>")


def kv_section(page: LandingInputs) -> str:
    """Each KV event stream: connected, what it held and stored, what was lost or refused."""
    rows = []
    for stream in page.streams:
        snap = stream.snapshot
        refused = ", ".join(f"{r} {n}" for r, n in sorted(stream.errors.items()) if n) or "-"
        stored, resident = ((", ".join(f"{m} {n:,}" for m, n in sorted(c.items()))
                             for c in (snap.stored, snap.resident)) if snap else ("-", "-"))
        cells = (stream.target, "up" if stream.up else "down", f"{stream.messages:,}", stored,
                 resident, f"{stream.lost:,}", refused)
        rows.append(_row(cells))
    table = _table("kv", ("target", "stream", "messages", "blocks stored", "resident", "lost",
                          "not used (reason count)"), rows)
    seen = sorted({r for stream in page.streams for r, n in stream.errors.items() if n})
    meanings = "".join(f"<li><code>{html.escape(r)}</code>: "
                       f"{html.escape(exposition.KV_ERROR_MEANINGS.get(r, ''))}</li>"
                       for r in seen)
    return table and ("<h2>KV event streams (docs/kv-events.md)</h2>" + table
                      + "<p class='legend'>messages: received; blocks stored: by medium; "
                        "resident: held now; lost: messages missed (sequence gaps)."
                      + (f"</p><ul class='legend'>{meanings}</ul>" if meanings else "</p>"))


def event_ledger_section(page: LandingInputs, window: str | None) -> str:
    """The ledger from the KV event streams, per model (the targets summed) and per target;
    empty when no target's stream has spoken."""
    ledgers = page.event_ledgers
    models = ledgers.models() if ledgers is not None else {}
    if ledgers is None or not models:
        return ""
    seconds = page.config.window_seconds.get(window or "", page.diag_seconds)
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
            if title == model:  # the model's ladder: what each fix is worth
                lines += ["", "The ladder (hit ratio with each fix added; docs/routers.md):",
                          *("  " + line for line in ladder_lines(ladder(
                              span.shares, span.prompt, ledgers.whatif.capacity(model,
                                                                                seconds))))]
            out.append(f"<h3>{html.escape(title)}</h3><pre>"
                       + html.escape("\n".join(lines)) + "</pre>")
    return "".join(out)


def _duration(seconds: float) -> str:
    """A chart's span or step in words, rounded as a person reads a clock."""
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.3g} s"


def charts_section(page: LandingInputs, now: float, cached: bool = True) -> str:
    """Each target's chart card, with its diagnosis. ``cached=False`` draws everything from
    scratch (the reference the cache must match)."""
    return charts(page, now, cached)[1]


def charts(page: LandingInputs, now: float, cached: bool = True
           ) -> tuple[dict[str, Chart], str]:
    """Each model's fleet chart (the headline draws it with axes), and each target's card."""
    threshold = page.config.thresholds.hit_ratio
    cache = page.charts
    with cache.lock:
        return _section(page, now, threshold, cache if cached else None)


def _section(page: LandingInputs, now: float, threshold: float, cache: ChartCache | None
             ) -> tuple[dict[str, Chart], str]:
    latest = max((v.last_success for v in page.targets if v.last_success == v.last_success),
                 default=now)
    oldest = latest
    plan: tuple[tuple[float, float], ...] = ()
    for view in page.targets:
        for state in view.series.values():
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
    for view in page.targets:
        if not view.up:
            continue
        by_model = {m: [s.history for s in states if s.history is not None]
                    for m, states in view.by_model().items()}
        by_model = {m: h for m, h in by_model.items() if h}
        if cache is None:
            charts = {m: Chart.of(bin_history(h, latest, width, page.charts.served))
                      for m, h in by_model.items()}
        else:
            charts = {m: cache.chart((view.name, m), h, latest, width)
                      for m, h in by_model.items()}
            seen.update((view.name, m) for m in by_model)
        for model, chart in sorted(charts.items()):
            per_target.append((view.name, model, chart))
            b = chart.binned
            if model in fleet:
                fleet[model].add(b)
            else:
                fleet[model] = Binned(b.start, b.end, b.rows.copy(), b.ttft_bounds)
    if cache is not None:
        for key in set(cache.entries) - seen:
            del cache.entries[key]
    active = {key: page.diagnosis.active(*key) for key in page.diagnosis.causes}
    ratio = "effective hit ratio" if page.charts.served == CACHED else "device hit ratio"
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
