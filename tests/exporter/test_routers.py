"""Routers as targets: the pages real vllm-router 0.1.17 and smg 1.13.0 wrote
(tests/fixtures/routers/), their workers matched to engine targets, and bad input counted,
never raised, the other targets untouched."""

from __future__ import annotations

import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab import exposition, routers
from prefixwatch.exporter.config import ConfigFlags, TargetConfig, build_config
from prefixwatch.exporter.pagescan import PageError
from prefixwatch.exporter.routers.match import match_workers
from prefixwatch.exporter.routers.page import read_router_page
from prefixwatch.exporter.service import Exporter
from tests.conftest import FIXTURES, refused_port

ROUTERS = FIXTURES / "routers"
W0, W1 = "http://127.0.0.1:47100", "http://127.0.0.1:47101"


def page(name: str) -> str:
    return (ROUTERS / f"{name}.txt").read_text()


# -- what each real page says ---------------------------------------------------------------------

@pytest.mark.parametrize(("fixture", "kind", "requests", "decisions", "predictions"), [
    ("vllm_router_kv_aware", "vllm_router", {W1: 12.0}, {"kv_aware": 12.0},
     {"vllm_router_kv_placement_lookups_total": (8.0, 12.0)}),
    ("vllm_router_cache_aware", "vllm_router", {W0: 40.0}, {"cache_aware": 40.0},
     {"vllm_router_prefix_routing_decisions_total": (36.0, 40.0)}),
    ("vllm_router_round_robin", "vllm_router", {W0: 20.0, W1: 20.0}, {"round_robin": 40.0}, {}),
    ("smg_cache_aware", "smg", {W0: 20.0, W1: 20.0}, {"cache_aware": 40.0},
     {"smg_cache_aware_match_ratio": (35.99958723523236, 40.0)}),
    ("smg_round_robin", "smg", {W0: 20.0, W1: 20.0}, {"round_robin": 40.0}, {}),
])
def test_real_router_pages(fixture: str, kind: str, requests: dict, decisions: dict,
                           predictions: dict) -> None:
    reading = read_router_page(page(fixture))
    assert reading.kind == kind
    assert sorted(reading.workers) == [W0, W1]  # both workers, traffic or not
    assert reading.worker_requests == requests
    assert reading.decisions == decisions
    assert reading.predictions == predictions
    assert reading.feed == {} and reading.errors == {}


SMG_FEED = """# TYPE smg_kv_event_gaps_total counter
smg_kv_event_gaps_total{worker="http://a:8000",outcome="replay_requested"} 2
smg_kv_event_gaps_total{worker="http://a:8000",outcome="unrecovered_kept"} 1
# TYPE smg_kv_event_resyncs_total counter
smg_kv_event_resyncs_total{worker="http://a:8000",reason="publisher_restart"} 1
"""


def test_smg_feed_problems_per_worker() -> None:
    reading = read_router_page(page("smg_cache_aware") + SMG_FEED)
    assert reading.feed == {("http://a:8000", "gap"): 3.0, ("http://a:8000", "resync"): 1.0}


@pytest.mark.parametrize(("text", "kind", "predictions"), [
    # llm-d's EPP (pkg/epp metrics: a histogram of the approximate index's hit ratio).
    ("# TYPE llm_d_epp_prefix_indexer_hit_ratio histogram\n"
     'llm_d_epp_prefix_indexer_hit_ratio_sum{plugin_name="p",plugin_type="prefix"} 7.5\n'
     'llm_d_epp_prefix_indexer_hit_ratio_count{plugin_name="p",plugin_type="prefix"} 10\n',
     "llm_d", {"llm_d_epp_prefix_indexer_hit_ratio": (7.5, 10.0)}),
    # Dynamo's KV router: predicted overlap over input blocks per request.
    ('dynamo_component_router_kv_hit_rate_sum{worker_id="decode-0"} 8\n'
     'dynamo_component_router_kv_hit_rate_count{worker_id="decode-0"} 10\n',
     "dynamo", {"dynamo_component_router_kv_hit_rate": (8.0, 10.0)}),
    # production-stack: decisions by algorithm; its re-exported engine gauges are not read.
    ('vllm:routing_decisions_total{algorithm="session",decision="x",reason="y"} 5\n'
     'vllm:gpu_prefix_cache_queries_total{server="http://e:8000"} 0\n',
     "production_stack", {}),
])
def test_routers_known_from_their_source(text: str, kind: str, predictions: dict) -> None:
    reading = read_router_page(text)
    assert reading.kind == kind and reading.predictions == predictions
    if kind == "production_stack":
        assert reading.decisions == {"session": 5.0}


def test_production_stack_is_a_router_not_an_old_vllm() -> None:
    """Its page carries vllm:gpu_prefix_cache_queries_total (vLLM 0.9's detect sample): the
    router kinds are checked first."""
    text = ('vllm:routing_decisions_total{algorithm="roundrobin"} 1\n'
            'vllm:gpu_prefix_cache_queries_total{server="http://e:8000"} 0\n')
    assert routers.detect(text) is routers.PRODUCTION_STACK


# -- bad input: counted, never raised ------------------------------------------------------

def test_newer_release_values_and_families_are_counted() -> None:
    newer = page("vllm_router_kv_aware").replace('result="hit"', 'result="partial_hit"')
    reading = read_router_page(newer)
    assert reading.errors == {"unknown_value": 1}
    assert reading.predictions == {"vllm_router_kv_placement_lookups_total": (0.0, 4.0)}
    renamed = read_router_page("# TYPE vllm_router_v2_lookups_total counter\n"
                               "vllm_router_v2_lookups_total 3\n")
    assert renamed.errors == {"no_known_family": 1} and renamed.predictions == {}
    retyped = page("vllm_router_kv_aware").replace(
        "# TYPE vllm_router_kv_placement_lookups_total counter",
        "# TYPE vllm_router_kv_placement_lookups_total gauge")
    assert read_router_page(retyped).errors == {}  # a gauge is still a number of lookups
    retyped = retyped.replace("placement_lookups_total gauge", "placement_lookups_total summary")
    assert read_router_page(retyped).errors == {"changed_type": 1}


def test_hostile_router_pages() -> None:
    with pytest.raises(PageError) as exc:
        read_router_page("vllm_router_cb_outcomes_total{worker=\"w\",outcome=\"success\"} -1\n")
    assert exc.value.reason == "invalid_value"
    with pytest.raises(PageError) as exc:
        read_router_page("<html>not metrics</html>")
    assert exc.value.reason == "not_metrics"
    many = "".join(f'smg_worker_requests_total{{worker="http://w{i}:80",model="m"}} 1\n'
                   for i in range(600))
    reading = read_router_page(many)
    assert len(reading.workers) == exposition.DEFAULT_MAX_SERIES
    assert reading.errors == {"too_many_series": 600 - exposition.DEFAULT_MAX_SERIES}
    long = f'smg_worker_requests_total{{worker="http://{"a" * 600}:80",model="m"}} 1\n'
    assert read_router_page(long + many[:200]).errors == {"label_too_long": 1}


def test_worker_matching() -> None:
    engines = [("e0", "http://127.0.0.1:47100/metrics"), ("e1", "http://LOCALHOST:80/metrics")]
    got = match_workers([
        ("r1", [W0, "http://localhost", "http://10.0.0.9:8000"], {}),
        ("r2", [W0, "http://pod-7:8000"], {"http://pod-7:8000": "e1"}),
    ], engines)
    assert got["r1"] == ({W0: "e0", "http://localhost": "e1"},
                         {"http://10.0.0.9:8000": exposition.ROUTER_UNMATCHED_NO_TARGET})
    # r2 claims what r1 already holds: counted shared, never joined twice.
    assert got["r2"] == ({}, {W0: exposition.ROUTER_UNMATCHED_SHARED,
                              "http://pod-7:8000": exposition.ROUTER_UNMATCHED_SHARED})


def test_router_config_keys(tmp_path) -> None:
    cfg = tmp_path / "c.yml"
    cfg.write_text("targets:\n- {url: 'http://e:8000/metrics', name: e}\n"
                   "- {url: 'http://r:9000/metrics', kind: router, workers: {'http://x:1': e}}\n")
    got = build_config(ConfigFlags(config_file=str(cfg)), environ={})
    assert got.targets[1].kind == "router" and got.targets[1].workers == (("http://x:1", "e"),)
    cfg.write_text("targets:\n- {url: 'http://r:9000/metrics', kind: gateway}\n")
    with pytest.raises(ConfigError, match="kind 'gateway'"):
        build_config(ConfigFlags(config_file=str(cfg)), environ={})
    cfg.write_text("targets:\n- {url: 'http://r:9000/metrics', kind: router, "
                   "workers: {'http://x:1': nobody}}\n")
    with pytest.raises(ConfigError, match="names no target"):
        build_config(ConfigFlags(config_file=str(cfg)), environ={})


# -- the exporter: routers beside engines --------------------------------------------------

def samples(exporter: Exporter) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(exporter.registry).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def exporter_with(*targets: TargetConfig) -> Exporter:
    from prefixwatch.exporter.config import ExporterConfig
    return Exporter(ExporterConfig(targets=targets, interval=5.0))


def test_exporter_routers_beside_engines(vllm_page: str, page_server, tmp_path, caplog) -> None:
    """Two routers claim the same two replicas (the second is counted shared); a router that
    is down and one that is slow cost only their own polls; the engines are untouched."""
    from tests.conftest import PageServer

    engine0, engine1, slow = PageServer(), PageServer(), PageServer()
    try:
        for server in (engine0, engine1):
            server.serve(vllm_page)
        kv_aware = page("vllm_router_kv_aware")
        for port, server in (("47100", engine0), ("47101", engine1)):
            kv_aware = kv_aware.replace(f"127.0.0.1:{port}", server.url.rsplit("/", 1)[0]
                                        .removeprefix("http://"))
        page_server.serve(kv_aware)
        slow.serve(page("smg_round_robin"), delay=3.0)
        with refused_port() as port:
            targets = (
                TargetConfig(engine0.url, name="e0"), TargetConfig(engine1.url, name="e1"),
                TargetConfig(page_server.url, name="router-a"),  # recognised from its page
                TargetConfig(page_server.url + "?second", name="router-b", kind="router"),
                TargetConfig(f"http://127.0.0.1:{port}/metrics", name="down", kind="router"),
                TargetConfig(slow.url, name="slow", kind="router", timeout=0.5))
            exporter = exporter_with(*targets)
            started = time.monotonic()
            exporter.poll_round()
            assert time.monotonic() - started < 2.5  # the slow router is cut at its deadline
            got = samples(exporter)
            samples(exporter)  # said once, not per scrape
    finally:
        for server in (engine0, engine1, slow):
            server.close()

    def value(name: str, **labels: str) -> float | None:
        return got.get((name, tuple(sorted(labels.items()))))

    assert value("prefixwatch_target_up", target="e0") == 1
    assert value("prefixwatch_target_up", target="router-a") == 1
    assert value("prefixwatch_target_up", target="down") == 0
    assert value("prefixwatch_target_up", target="slow") == 0
    assert value("prefixwatch_scrape_errors_total", target="slow", reason="timeout") == 1
    assert value("prefixwatch_scrape_errors_total", target="down", reason="connect") == 1
    w0 = engine0.url.removesuffix("/metrics")
    assert value("prefixwatch_router_worker_target", router="router-a", worker=w0,
                 target="e0") == 1
    assert value("prefixwatch_router_unmatched_workers", router="router-a",
                 reason="shared") == 0
    assert value("prefixwatch_router_unmatched_workers", router="router-b",
                 reason="shared") == 2
    said = [r.getMessage() for r in caplog.records if "matched to no engine target" in r.message]
    assert len(said) == 2 and all("router-b" in m and "claims" in m for m in said), said
    assert value("prefixwatch_router_predicted_hits_total", router="router-a",
                 source="vllm_router_kv_placement_lookups_total") == 8
    assert value("prefixwatch_router_predictions_total", router="router-a",
                 source="vllm_router_kv_placement_lookups_total") == 12
    assert value("prefixwatch_router_decisions_total", router="router-a", policy="kv_aware") == 12
    assert value("prefixwatch_router_info", router="router-a", kind="vllm_router") == 1
    # The engines' own series are as without routers; the routers have no engine figures.
    assert value("prefixwatch_prefix_cache_queries_total", target="e0", engine="0",
                 model_name="meta-llama/Llama-3.1-8B-Instruct", server="vllm") is not None
    assert not any(k[0].startswith("prefixwatch_prefix_cache") and ("target", "router-a")
                   in k[1] for k in got)


def test_status_shows_a_router_its_workers_and_its_belief(vllm_page: str) -> None:
    from prefixwatch.exporter.config import ExporterConfig
    from prefixwatch.exporter.status import collect_status, render
    from tests.conftest import PageServer

    engine, router = PageServer(), PageServer()
    try:
        engine.serve(vllm_page)
        w = engine.url.removesuffix("/metrics").removeprefix("http://")
        router.serve(page("vllm_router_kv_aware").replace("127.0.0.1:47101", w))
        rows = collect_status(ExporterConfig(targets=(
            TargetConfig(engine.url, name="e0"), TargetConfig(router.url, name="r"))), 0.1)
    finally:
        engine.close()
        router.close()
    (row,) = [r for r in rows if r.schema == "router"]
    assert row.target == "r" and row.server == "vllm_router" and not row.error
    assert f"http://{w} -> e0" in row.note and "no prediction in the gap" in row.note
    assert "(no_target)" in row.note  # 47100 serves no target here
    text = render(rows, 0.1)
    assert "r  " in text and "Diagnosis" in text and "r -:" not in text


def test_the_landing_page_names_a_router_target(vllm_page: str) -> None:
    exporter = exporter_with(TargetConfig("http://127.0.0.1:1/metrics", name="e0"),
                             TargetConfig("http://127.0.0.1:2/metrics", name="gateway"))
    exporter.monitors[0].ingest(vllm_page, time.time())
    exporter.monitors[1].ingest(page("smg_cache_aware"), time.time())
    html = exporter.landing_page()
    assert ("<tr><td>gateway</td><td>http://127.0.0.1:2/metrics</td><td>up</td>"
            "<td>router (smg)</td>") in html
