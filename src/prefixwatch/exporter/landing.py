"""The landing page at `/`: one HTML table of targets, their state, ratios and diagnosis.

Kept apart from the HTTP server so the page can grow (charts) without touching the serving code.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from prefixwatch.core.version import __version__

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
        "<style>body{font-family:sans-serif}td,th{padding:2px 10px;text-align:left}</style>"
        f"</head><body><h1>prefixwatch {__version__}</h1>"
        "<p><a href='/metrics'>/metrics</a> · <a href='/healthz'>/healthz</a></p>"
        "<table><tr><th>target</th><th>url</th><th>state</th><th>schema</th>"
        "<th>hit ratio</th><th>diagnosis (docs/runbooks.md#diagnosis)</th>"
        "<th>last error</th></tr>" + "".join(rows) + "</table>"
        "</body></html>")
