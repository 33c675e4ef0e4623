"""The exporter against real HTTP servers on loopback: values, windows, faults, exposition."""

from __future__ import annotations

import logging
import time

import pytest
import requests
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.vocab import exposition
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.monitor import TargetMonitor
from prefixwatch.exporter.service import Exporter
from tests.conftest import PageServer, refused_port, with_counters

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WINDOWS = {"1m": 60.0, "5m": 300.0}
DUPLICATE_LINE = f'vllm:prefix_cache_hits_total{{engine="0",model_name="{MODEL}"}} 1.0\n'


def samples(exporter: Exporter) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(exporter.registry).decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def pick(found: dict, name: str, **labels: str) -> list[float]:
    return [v for (n, ls), v in found.items()
            if n == name and all(dict(ls).get(k) == val for k, val in labels.items())]


def make_exporter(*urls: str, interval: float = 0.2) -> Exporter:
    cfg = ExporterConfig(targets=name_targets([TargetConfig(u, timeout=1.0) for u in urls]),
                         interval=interval, listen_address="127.0.0.1:0", windows=("1m", "5m"))
    return Exporter(cfg)


def test_counters_and_window_ratio_from_the_real_page(page_server: PageServer,
                                                      vllm_page: str) -> None:
    exporter = make_exporter(page_server.url)
    mon = exporter.monitors[0]
    page_server.serve(vllm_page)
    exporter.poll_round()
    found = samples(exporter)
    t = mon.name
    assert pick(found, "prefixwatch_prefix_cache_queries_total", target=t, model_name=MODEL,
                engine="0", server="vllm") == [13902.0]
    assert pick(found, "prefixwatch_prefix_cache_hits_total", target=t) == [7168.0]
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", window="lifetime") == [
        pytest.approx(7168 / 13902)]
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", window="1m") == []  # one poll
    assert pick(found, "prefixwatch_target_up", target=t) == [1.0]
    assert pick(found, "prefixwatch_cache_block_size_tokens") == [16.0]
    assert pick(found, "prefixwatch_prefix_caching_enabled") == [1.0]
    assert pick(found, "prefixwatch_time_to_first_token_seconds_count") == [12.0]
    # Later poll: 1,000 more queries, 30 more hits -> 3% over the window, lifetime hides it.
    page_server.serve(with_counters(vllm_page, 14902, 7198))
    exporter.poll_round()
    found = samples(exporter)
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", window="1m") == [
        pytest.approx(0.03)]
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", window="lifetime") == [
        pytest.approx(7198 / 14902)]
    assert pick(found, "prefixwatch_fleet_prefix_cache_hit_ratio", window="1m") == [
        pytest.approx(0.03)]
    # A minute with no traffic: the window ratio is absent, not 0 and not NaN; the 5m window
    # still covers the collapse.
    later = time.time() + 30
    for step in range(3):
        mon.ingest(with_counters(vllm_page, 14902, 7198), later + 30 * step)
    found = samples(exporter)
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", window="1m") == []
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", window="5m") == [
        pytest.approx(0.03)]
    assert "NaN" not in generate_latest(exporter.registry).decode()


def test_restart_inside_window_is_not_a_negative_rate(page_server: PageServer,
                                                      vllm_page: str) -> None:
    exporter = make_exporter(page_server.url)
    page_server.serve(with_counters(vllm_page, 10000, 9000))
    exporter.poll_round()
    page_server.serve(with_counters(vllm_page, 11000, 9900))
    exporter.poll_round()
    page_server.serve(with_counters(vllm_page, 500, 50))  # restarted, cold cache
    exporter.poll_round()
    found = samples(exporter)
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", window="1m") == [
        pytest.approx((900 + 50) / (1000 + 500))]
    assert pick(found, "prefixwatch_prefix_cache_queries_total") == [500.0]  # reset stays


def test_fleet_sums_before_dividing(vllm_page: str) -> None:
    a, b = PageServer(), PageServer()
    try:
        exporter = make_exporter(a.url, b.url)
        a.serve(with_counters(vllm_page, 1000, 900))
        b.serve(with_counters(vllm_page, 100, 10))
        exporter.poll_round()
        a.serve(with_counters(vllm_page, 10000, 9000))  # busy replica: 90%
        b.serve(with_counters(vllm_page, 200, 20))  # idle replica: 10%
        exporter.poll_round()
        found = samples(exporter)
        fleet = pick(found, "prefixwatch_fleet_prefix_cache_hit_ratio", window="1m")
        assert fleet == [pytest.approx((8100 + 10) / (9000 + 100))]
        assert fleet[0] != pytest.approx((0.9 + 0.1) / 2)
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("setup,reason", [
    (lambda s, p: s.serve("not found", status=404), "http_status"),
    (lambda s, p: s.serve("oops", status=500), "http_status"),
    (lambda s, p: s.serve("<html><body>Bad gateway</body></html>",
                          content_type="text/html"), "not_metrics"),
    (lambda s, p: s.serve("<!doctype html><title>login</title>\n"), "not_metrics"),
    (lambda s, p: s.serve(p[: len(p) // 2]), "parse"),
    (lambda s, p: s.serve(p, chunked_truncate=True), "parse"),
    (lambda s, p: s.serve(p.replace("13902.0", "NaN", 1)), "invalid_value"),
    (lambda s, p: s.serve(p + DUPLICATE_LINE), "parse"),
    (lambda s, p: s.serve(p, delay=2.0), "timeout"),
    (lambda s, p: s.serve("x" * 200_000), "too_large"),
    (lambda s, p: s.serve("python_info 1\n"), "not_metrics"),
])
def test_faults_mark_the_target_down_with_a_reason(page_server: PageServer, vllm_page: str,
                                                   setup, reason: str) -> None:
    setup(page_server, vllm_page)
    target = TargetConfig(page_server.url, name="t", timeout=1.0, max_body_bytes=100_000)
    mon = TargetMonitor(target, WINDOWS, 1.0)
    mon.poll()
    view = mon.view
    assert not view.up
    assert view.reason == reason, view.last_error
    assert view.errors[reason] == 1


def test_connection_refused() -> None:
    with refused_port() as port:
        target = TargetConfig(f"http://127.0.0.1:{port}/metrics", name="t", timeout=1.0)
        mon = TargetMonitor(target, WINDOWS, 1.0)
        mon.poll()
    assert (mon.view.up, mon.view.reason) == (False, "connect")


def test_bad_target_does_not_disturb_the_others(vllm_page: str, caplog) -> None:
    good, bad = PageServer(), PageServer()
    try:
        exporter = make_exporter(good.url, bad.url)
        good.serve(vllm_page)
        bad.serve("boom", status=500)
        with caplog.at_level(logging.INFO, logger="prefixwatch.exporter"):
            for _ in range(3):
                exporter.poll_round()
        found = samples(exporter)
        g, b = (m.name for m in exporter.monitors)
        assert pick(found, "prefixwatch_target_up", target=g) == [1.0]
        assert pick(found, "prefixwatch_target_up", target=b) == [0.0]
        assert pick(found, "prefixwatch_scrape_errors_total", target=b, reason="http_status") == [
            3.0]
        assert pick(found, "prefixwatch_scrape_errors_total", target=g, reason="timeout") == [0.0]
        assert pick(found, "prefixwatch_prefix_cache_hits_total", target=g) == [7168.0]
        assert pick(found, "prefixwatch_prefix_cache_hits_total", target=b) == []
        downs = [r for r in caplog.records if "is down" in r.getMessage()]
        assert len(downs) == 1, "logged once per state change, not on every poll"
        bad.serve(vllm_page)
        with caplog.at_level(logging.INFO, logger="prefixwatch.exporter"):
            exporter.poll_round()
            exporter.poll_round()
        assert len([r for r in caplog.records if "up again" in r.getMessage()]) == 1
    finally:
        good.close()
        bad.close()


def test_engine_version_change_is_followed(page_server: PageServer, vllm_page: str,
                                           caplog) -> None:
    exporter = make_exporter(page_server.url)
    page_server.serve('vllm:gpu_prefix_cache_queries_total{model_name="m"} 100\n'
                      'vllm:gpu_prefix_cache_hits_total{model_name="m"} 50\n')
    exporter.poll_round()
    with caplog.at_level(logging.WARNING, logger="prefixwatch.exporter"):
        page_server.serve(vllm_page)
        exporter.poll_round()
    assert any("changed metric schema" in r.getMessage() for r in caplog.records)
    found = samples(exporter)
    assert pick(found, "prefixwatch_target_info", schema="vllm_v1") == [1.0]
    assert pick(found, "prefixwatch_prefix_cache_hits_total", model_name=MODEL) == [7168.0]


def test_v0_target_passes_the_gauge_through(page_server: PageServer) -> None:
    exporter = make_exporter(page_server.url)
    page_server.serve('vllm:gpu_prefix_cache_hit_rate{model_name="old"} 0.42\n')
    exporter.poll_round()
    exporter.poll_round()
    found = samples(exporter)
    assert pick(found, "prefixwatch_engine_reported_hit_ratio", model_name="old",
                source="vllm:gpu_prefix_cache_hit_rate") == [0.42]
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio") == []


def test_bearer_token_and_pre_initialised_errors(page_server: PageServer, vllm_page: str,
                                                 tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    page_server.serve(vllm_page)
    cfg = ExporterConfig(
        targets=name_targets([TargetConfig(page_server.url, bearer_token_file=str(token))]),
        listen_address="127.0.0.1:0", windows=("1m",))
    exporter = Exporter(cfg)
    exporter.poll_round()
    assert page_server.headers[-1]["Authorization"] == "Bearer s3cret"
    found = samples(exporter)
    for reason in exposition.SCRAPE_ERROR_REASONS:
        assert pick(found, "prefixwatch_scrape_errors_total", reason=reason) == [0.0]
    found_names = {n for n, _ in found}
    assert all(":" not in n for n in found_names if n.startswith("prefixwatch"))


def test_http_endpoints(page_server: PageServer, vllm_page: str) -> None:
    page_server.serve(vllm_page)
    exporter = make_exporter(page_server.url, interval=0.1)
    exporter.start()
    try:
        base = f"http://127.0.0.1:{exporter.port}"
        deadline = time.monotonic() + 10
        while exporter.rounds < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert requests.get(base + "/healthz", timeout=5).text == "ok\n"
        page = requests.get(base + "/", timeout=5).text
        assert "up" in page and page_server.url in page
        metrics = requests.get(base + "/metrics", timeout=5)
        assert metrics.status_code == 200
        assert "prefixwatch_prefix_cache_hit_ratio" in metrics.text
        assert "prefixwatch_build_info" in metrics.text
        assert "process_resident_memory_bytes" in metrics.text
        assert requests.get(base + "/nope", timeout=5).status_code == 404
    finally:
        exporter.stop()


def test_a_slow_target_does_not_hold_up_the_round(vllm_page: str) -> None:
    """Targets are polled concurrently: a slow (but in-time) target costs its own delay, not
    the sum of everyone's."""
    servers = [PageServer() for _ in range(4)]
    try:
        for s in servers:
            s.serve(vllm_page, delay=0.6)
        exporter = make_exporter(*(s.url for s in servers))
        exporter.poll_round()
        assert all(v.up for v in exporter.views())
        # Structural, not a stopwatch: some polls were in flight at the same time (one by
        # one, each would end before the next began).
        spans = sorted(span for s in servers for span in s.spans)
        overlapping = sum(1 for a, b in zip(spans, spans[1:], strict=False) if b[0] < a[1])
        assert overlapping >= 1, f"targets were polled one by one: {spans}"
    finally:
        for s in servers:
            s.close()
