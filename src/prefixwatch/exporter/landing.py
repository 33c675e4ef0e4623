"""The landing page at `/`: one HTML table of targets, their state, ratios and diagnosis.

Kept apart from the HTTP server so the page can grow (charts) without touching the serving code.
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from prefixwatch.core.ledger import event_table
from prefixwatch.core.ledger import table as ledger_table
from prefixwatch.core.version import __version__
from prefixwatch.exporter.charts import charts_section
from prefixwatch.exporter.status import LEDGER_NEEDS_LOG, tier_shares

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
                f"{m}: {f.windows[window].hit_ratio:.1%} ({window})"
                + _effective_note(f.windows[window].effective_ratio)
                for m, f in sorted(mon.models.items())
                if window in f.windows and f.windows[window].hit_ratio is not None)
        with exporter.state.lock:
            causes = "; ".join(
                f"{model}: {', '.join(exporter.state.diagnosis.active(mon.name, model)) or '-'}"
                for (target, model) in sorted(exporter.state.diagnosis.causes)
                if target == mon.name) if mon.up else ""
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in (
            mon.name, mon.target.display_url, state, schema, ratios, causes, error)) + "</tr>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>prefixwatch</title>"
        "<meta http-equiv='refresh' content='15'>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:left}" + CSS +
        "</style>"
        f"</head><body><h1>prefixwatch {__version__}</h1>"
        "<p><a href='/metrics'>/metrics</a> · <a href='/healthz'>/healthz</a></p>"
        "<table><tr><th>target</th><th>url</th><th>state</th><th>schema</th>"
        "<th>hit ratio (device, effective)</th><th>diagnosis (docs/runbooks.md#diagnosis)</th>"
        "<th>last error</th></tr>" + "".join(rows) + "</table>"
        + tier_section(exporter, window) + kv_section(exporter)
        + ledger_section(exporter, window)
        + charts_section(exporter, time.time())
        + "</body></html>")


def _effective_note(value: float | None) -> str:
    """The effective ratio next to the device one (every tier, not the device pool alone)."""
    return "" if value is None else f", effective {value:.1%}"


def tier_section(exporter: Exporter, window: str | None) -> str:
    """A table of each target's prompt tokens by the cache tier that served them over the
    first window (docs/tiers.md): the device ratio alone misses what a host tier saves."""
    tier_names = ("device", "host", "disk", "remote", "unknown", "recomputed")
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
                effective = wf.effective_ratio if wf is not None else None
                cells = [mon.name, model, *(f"{shares[t]:.1%}" for t in tier_names),
                         "-" if effective is None else f"{effective:.1%}"]
                rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells)
                            + "</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("target", "model", *tier_names, "effective"))
    return (f"<h2>Prompt tokens by cache tier ({html.escape(str(window))}, "
            "docs/tiers.md)</h2><table class='tiers'><tr>" + head + "</tr>"
            + "".join(rows) + "</table>")


def ledger_section(exporter: Exporter, window: str | None) -> str:
    """Where the window's prompt tokens went (core/ledger.py), or that it needs a request log."""
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
        hits = []
        for mon in exporter.monitors:
            with mon.lock:
                for figures in mon.models.values():
                    wf = figures.windows.get(window or "")
                    if mon.up and wf is not None and wf.hits == wf.hits:  # not NaN
                        hits.append(wf.hits)
        achieved = round(sum(hits)) if hits else None
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
        resident = ", ".join(f"{m} {n:,}" for m, n in sorted(snap.resident.items())) if snap \
            else "-"
        stored = ", ".join(f"{m} {n:,}" for m, n in sorted(snap.stored.items())) if snap \
            else "-"
        cells = (source.target, "up" if up else "down", f"{source.messages:,}", stored,
                 resident, f"{lost:,}", refused)
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    if not rows:
        return ""
    head = "".join(f"<th>{h}</th>" for h in ("target", "stream", "messages", "blocks stored",
                                             "resident", "lost", "not used (reason count)"))
    return ("<h2>KV event streams (README: KV events)</h2><table class='kv'><tr>" + head
            + "</tr>" + "".join(rows) + "</table>")


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


#: The charts' cards (exporter/charts.py), laid out to fill a 1280-pixel window.
CSS = (".cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #ddd;padding:6px;"
       "width:362px;font-size:13px}.card.fleet{display:inline-block;margin:0 10px 10px 0}"
       ".card .head{margin-bottom:4px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}"
       ".low{color:#d62728;font-weight:bold}.ok{color:#2ca02c;font-weight:bold}"
       ".diag{color:#555;margin-top:2px}.legend{color:#444;font-size:13px}"
       "svg .ttft{font-size:10px;fill:#a63603}")
