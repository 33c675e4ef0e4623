"""`prefixwatch report`: an incident report from Prometheus (HTML, Markdown, figures).

Imports only core (import-linter enforces it); the CLI passes the threshold from the mixin
config, so the report never reads the mixin itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefixwatch.report.collect import Collector
from prefixwatch.report.divergence import first_divergence
from prefixwatch.report.model import ReportData, Request
from prefixwatch.report.promapi import PromClient, ReportError

__all__ = ["ReportError", "Request", "Written", "write_report"]


@dataclass(frozen=True)
class Written:
    """What write_report produced."""

    directory: Path
    html: Path
    markdown: Path
    figures: list[Path]
    data: ReportData


def write_report(prometheus: str, out_dir: str | Path, request: Request,
                 requests_log: str | None = None, block_size: int = 16,
                 tokenizer: str | None = None, timeout: float = 60.0) -> Written:
    """Query Prometheus over the request's range and write report.html, report.md and the
    figures (PNG and SVG) into ``out_dir``. Raises ReportError on anything the user can fix
    (``timeout``: seconds for all the queries to Prometheus together)."""
    # matplotlib and jinja2 load here, not with the package, so `report --help` stays light.
    from prefixwatch.report import poolfigure
    from prefixwatch.report.figures import figure1, figure2, figure3
    from prefixwatch.report.render import render_html, render_markdown

    client = PromClient(prometheus, timeout=timeout)
    try:
        data = Collector(client, request).collect()
    finally:
        client.close()
    finding = first_divergence(requests_log, block_size, tokenizer) if requests_log else None
    data.divergence = finding.__dict__ if finding else None
    drawn = [("figure1-hit-ratio-ttft", figure1(data)), ("figure2-tiers", figure2(data)),
             ("figure3-ledger", figure3(data)), (poolfigure.NAME, poolfigure.figure4(data))]
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for fig in (f for _, f in drawn if f is not None):
            for suffix, content in ((".png", fig.png), (".svg", fig.svg.encode())):
                path = out / f"{fig.name}{suffix}"
                path.write_bytes(content)
                paths.append(path)
        html = out / "report.html"
        html.write_text(render_html(data, drawn, finding), encoding="utf-8")
        md = out / "report.md"
        md.write_text(render_markdown(data, drawn, finding), encoding="utf-8")
    except OSError as exc:
        raise ReportError(f"cannot write the report into {out}: {exc.strerror}") from None
    return Written(out, html, md, paths, data)
