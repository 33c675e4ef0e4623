"""The landing page's charts: drawn from the exporter's own history, escaped, and rendered by
real chromium from a running exporter."""

from __future__ import annotations

import time
from pathlib import Path

import requests

from prefixwatch.exporter.charts import BINS, bin_history, svg_chart
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.landing import render_landing
from prefixwatch.exporter.service import Exporter
from tests import browser
from tests.conftest import PageServer, with_counters

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _exporter(*urls: str) -> Exporter:
    return Exporter(ExporterConfig(targets=name_targets([TargetConfig(u) for u in urls]),
                                   interval=5.0, listen_address="127.0.0.1:0"))


def _regression(exporter: Exporter, page: str, polls: int = 120, interval: float = 5.0
                ) -> float:
    """Ten minutes of polls: a healthy 89% hit ratio, then 3% from half-way."""
    start = time.time() - polls * interval
    queries = hits = 0.0
    for i in range(polls):
        queries += 1000
        hits += 890 if i < polls // 2 else 30
        for mon in exporter.monitors:
            mon.ingest(with_counters(page, queries, hits), start + i * interval)
    exporter.update_diagnosis(start + polls * interval)
    return start


def test_binned_history_follows_the_counters(vllm_page: str) -> None:
    exporter = _exporter("http://127.0.0.1:9/metrics")
    start = _regression(exporter, vllm_page)
    mon = exporter.monitors[0]
    histories = [s.history for s in mon.series.values()]
    binned = bin_history(histories, mon.last_success, span=mon.last_success - start)
    ratios = [r for r in binned.ratios() if r is not None]
    assert len(ratios) >= BINS - 2
    assert abs(ratios[2] - 0.89) < 0.01 and abs(ratios[-1] - 0.03) < 0.01
    assert sum(binned.queries) == sum(binned.queries)  # no NaN
    svg = svg_chart(binned, 0.7, "t")
    assert svg.startswith("<svg") and svg.count("<polyline") >= 1 and "stroke-dasharray" in svg


def test_every_label_value_is_escaped(vllm_page: str) -> None:
    hostile = '<img src=x onerror="alert(1)">'
    page = vllm_page.replace(MODEL, hostile.replace('"', "'"))
    exporter = _exporter("http://127.0.0.1:9/metrics?<b>x</b>")
    _regression(exporter, page, polls=20)
    html = render_landing(exporter)
    assert "<img" not in html and "<b>x" not in html
    assert "&lt;img src=x onerror=" in html
    assert html.count('<svg class="chart"') == 2  # the fleet and the one target


def test_landing_page_renders_in_chromium(vllm_page: str, tmp_path: Path) -> None:
    servers = [PageServer() for _ in range(3)]
    for server in servers:
        server.serve(with_counters(vllm_page, 10, 5))
    exporter = _exporter(*(s.url for s in servers))
    try:
        _regression(exporter, vllm_page)
        exporter.start()
        url = f"http://127.0.0.1:{exporter.port}/"
        body = requests.get(url, timeout=5).text
        assert "http-equiv='refresh'" in body and "src=" not in body  # nothing fetched
        loaded = browser.load(url)
        assert loaded.dom.count('class="chart"') == 4  # one fleet chart, three targets
        assert "diagnosis:" in loaded.dom
        assert loaded.console_errors == []
        shot = tmp_path / "landing.png"
        assert browser.screenshot(url, shot) == []
        assert browser.non_blank(shot)
    finally:
        exporter.stop()
        for server in servers:
            server.close()
