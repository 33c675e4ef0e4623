"""The landing page's charts: drawn from the exporter's own history, escaped, and rendered by
real chromium from a running exporter."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import requests

from prefixwatch.exporter.chartbins import BINS, bin_history
from prefixwatch.exporter.charts import svg_chart
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.landing import charts, charts_section, render_landing
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
    view = mon.view
    histories = [s.history for s in view.series.values()]
    binned = bin_history(histories, view.last_success, width=(view.last_success - start) / BINS)
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
    html = render_landing(exporter.landing_inputs())
    assert "<img" not in html and "<b>x" not in html
    assert "&lt;img src=x onerror=" in html
    assert html.count('<svg class="chart big"') == 1  # the fleet's headline chart, with axes
    assert html.count('<svg class="chart"') == 1  # the one target's card


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
        assert loaded.dom.count('class="chart big"') == 1  # one fleet chart, with axes
        assert loaded.dom.count('class="chart"') == 3  # three targets' cards
        assert "diagnosis:" in loaded.dom
        assert loaded.console_errors == []
        shot = tmp_path / "landing.png"
        assert browser.screenshot(url, shot) == []
        assert browser.non_blank(shot)
    finally:
        exporter.stop()
        for server in servers:
            server.close()


OTHER = "acme/other-model"


def _page(page: str, queries: float, hits: float, ttft: float, slow: float,
          other: bool = False, other_ttft: bool = True) -> str:
    """A poll: prefix-cache counters, the TTFT histogram grown ``ttft`` times plus ``slow``
    requests over 1 s (so its median moves), and optionally a second model (without its
    histogram: a new layout, so a new history)."""
    out = []
    for line in with_counters(page, queries, hits).splitlines():
        head, _, value = line.rpartition(" ")
        if line.startswith("vllm:time_to_first_token_seconds_bucket{"):
            le = float(re.search(r'le="([^"]+)"', line).group(1))
            line = f"{head} {float(value) * ttft + (slow if le >= 1.0 else 0.0)}"
        elif line.startswith("vllm:time_to_first_token_seconds_count{"):
            line = f"{head} {float(value) * ttft + slow}"
        out.append(line)
        if (other and MODEL in line and not line.startswith("#")
                and (other_ttft or "time_to_first_token" not in line)):
            out.append(line.replace(MODEL, OTHER))
    return "\n".join(out) + "\n"


def _same_render(exporter: Exporter, now: float) -> str:
    """The cards drawn from the cache equal those drawn from scratch, and so do the fleet
    charts the headline draws with axes."""
    fleet, cached = charts(exporter.landing_inputs(), now)
    fresh_fleet, fresh = charts(exporter.landing_inputs(), now, cached=False)
    assert cached == fresh
    assert ({m: c.svg_with_axes(0.5, m) for m, c in fleet.items()}
            == {m: c.svg_with_axes(0.5, m) for m, c in fresh_fleet.items()})
    return cached


def test_charts_draw_the_ratio_that_pages(vllm_page: str) -> None:
    """A host tier rescues the fleet (device 10%, host 80%): the cards show the effective 90%
    against the threshold, as the alerts judge it, not the device's 10%."""
    exporter = _exporter("http://127.0.0.1:9/metrics")
    start = time.time() - 600
    for i in range(60):
        queries = 1000.0 * (i + 1)
        page = with_counters(vllm_page, queries, 0.1 * queries)
        page = re.sub(r'(source="host"\}) \S+', rf"\g<1> {0.8 * queries}", page)
        exporter.monitors[0].ingest(page, start + i * 10)
    html = charts_section(exporter.landing_inputs(), start + 600)
    assert "effective hit ratio" in html
    assert html.count('<span class="ok">90.0%</span>') == 1, html  # the target's card
    fleet = charts(exporter.landing_inputs(), start + 600)[0][MODEL]
    assert fleet.current() == pytest.approx(0.9)  # the headline's chart, with axes
    axes = fleet.svg_with_axes(0.5, "fleet")
    assert all(f">{tick}%</text>" in axes for tick in (0, 25, 50, 75, 100)), axes
    assert len(re.findall(r">\d\d:\d\d:\d\d</text>", axes)) == 5  # clock times below


def test_landing_page_fits_1280_pixels(vllm_page: str, tmp_path: Path) -> None:
    """Two models' cards, a target that is down with a long error and one over a limit: the
    page is no wider than a 1280-pixel window (chromium measures it)."""
    page_server = PageServer()
    try:
        exporter = _exporter(page_server.url, "http://127.0.0.1:9/" + "metrics" * 40)
        _regression(exporter, vllm_page)
        exporter.monitors[1].poll()  # refused: up=0 with its error
        html = render_landing(exporter.landing_inputs()).replace("</body>", (
            "<script>document.body.setAttribute('data-width', "
            "document.documentElement.scrollWidth)</script></body>"))
        path = tmp_path / "landing.html"
        path.write_text(html)
        dom = browser.load(path.as_uri(), width=1280).dom
        width = int(re.search(r'data-width="(\d+)"', dom).group(1))
        assert width <= 1280, width
        shot = tmp_path / "landing.png"
        assert browser.screenshot(path.as_uri(), shot) == []
    finally:
        page_server.close()


def test_cached_render_equals_a_fresh_one(vllm_page: str) -> None:
    """Poll by poll, across a counter reset, a model appearing, vanishing and coming back, its
    history restarting (a new layout), a target lagging the other, polls landing exactly on
    bin edges, and the grid widening as history grows."""
    exporter = _exporter("http://127.0.0.1:9/metrics", "http://127.0.0.1:10/metrics")
    a, b = exporter.monitors
    start = (time.time() // 3600 - 1) * 3600  # polls at multiples of 5 s: some on bin edges
    queries = hits = ttft = slow = 0.0
    widths = set()
    for i in range(90):
        queries, hits = (queries + 1000, hits + (800 if i % 20 < 10 else 100))
        ttft, slow = ttft + 1, slow + (i % 7)
        if i == 30:  # a restart: every counter starts again from zero
            queries, hits, ttft, slow = 1000.0, 800.0, 1.0, 0.0
        other = 40 <= i < 55 or i >= 65
        now = start + i * 5.0
        a.ingest(_page(vllm_page, queries, hits, ttft, slow, other, i not in (70, 71)), now)
        if i % 9 != 4:  # b misses a poll now and then: it lags a
            b.ingest(_page(vllm_page, queries, hits / 2, ttft, slow), now + 1.5)
        html = _same_render(exporter, now + 3)
        widths.add(re.search(r"one point per ([^<]+)<", html).group(1))
        if i == 45:
            assert OTHER in html
    assert html.count('<svg class="chart"') == 3  # three target charts (the fleets': above)
    assert "TTFT p50 peak" in html and len(widths) >= 2


def test_cached_render_equals_a_fresh_one_over_an_hour(vllm_page: str) -> None:
    """The steady state: an hour's grid, bins completing and scrolling out, tiers trimming."""
    exporter = _exporter("http://127.0.0.1:9/metrics")
    mon = exporter.monitors[0]
    start = time.time() - 5000
    queries = hits = 0.0
    for i in range(800):
        queries, hits = queries + 1000, hits + (900 if i < 400 else 50 + i % 13)
        mon.ingest(_page(vllm_page, queries, hits, i + 1.0, i // 3), start + i * 5.0)
        if i == 740 or (i > 760 and i % 2):
            html = _same_render(exporter, start + i * 5.0)
    assert "the last 60 min, one point per 75 s" in html and "TTFT p50 peak" in html


def test_the_first_screen_answers(vllm_page: str, tmp_path: Path) -> None:
    """At 1280x800, above the fold: the fleet's hit ratio now, the culprit in words and the
    chart with axes; the tables come after (chromium measures where each one is)."""
    from prefixwatch.core.story import Culprit

    exporter = _exporter("http://127.0.0.1:9/metrics", "http://127.0.0.1:10/metrics")
    _regression(exporter, vllm_page)
    with exporter.state.lock:
        exporter.state.culprits = {MODEL: Culprit("date/time", 19, 0.9)}
    page = render_landing(exporter.landing_inputs()).replace("</body>", (
        "<script>for (const [name, sel] of [['ratio', '.story .big'], ['culprit', '.culprit'],"
        " ['chart', 'svg.big'], ['tables', 'table.targets']]) {"
        " const r = document.querySelector(sel).getBoundingClientRect();"
        " document.body.setAttribute('data-' + name, Math.round(r.bottom)); }</script></body>"))
    path = tmp_path / "landing.html"
    path.write_text(page)
    dom = browser.load(path.as_uri(), width=1280, height=800).dom
    bottom = {k: int(re.search(rf'data-{k}="(\d+)"', dom).group(1))
              for k in ("ratio", "culprit", "chart", "tables")}
    assert bottom["ratio"] < bottom["culprit"] < bottom["chart"] <= 800, bottom
    assert bottom["tables"] > bottom["chart"], bottom
    assert "3.0%" in page and "a date/time at token 19 of the prompt changes on every " \
        "request" in page
    assert ">100%</text>" in page and ">0%</text>" in page  # the chart's axis


def test_every_kv_count_is_explained_where_it_appears(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """unknown_block 129 on the landing page comes with what it means, under the table."""
    from prefixwatch.core.vocab import exposition
    from prefixwatch.exporter.kvsubscriber.source import FleetRegistry, KvSource
    from prefixwatch.exporter.landing import kv_section

    assert set(exposition.KV_ERROR_MEANINGS) == set(exposition.KV_ERROR_REASONS)
    exporter = _exporter("http://127.0.0.1:9/metrics")
    source = KvSource("vllm-0", FleetRegistry())
    source.count(exposition.KV_ERROR_UNKNOWN_BLOCK, 129)
    source.count(exposition.KV_ERROR_UNKNOWN_PARENT, 56)
    monkeypatch.setattr(exporter.kv, "all_sources", lambda: [source])
    section = kv_section(exporter.landing_inputs())
    assert "unknown_block 129" in section and "unknown_parent 56" in section
    for reason in (exposition.KV_ERROR_UNKNOWN_BLOCK, exposition.KV_ERROR_UNKNOWN_PARENT):
        assert f"<code>{reason}</code>: {exposition.KV_ERROR_MEANINGS[reason]}" in section
