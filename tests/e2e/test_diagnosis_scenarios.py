"""Every simulator scenario, run with the exporter and its requests log: the diagnosis names the
scenario's cause and no unrelated one; the healthy ones show none.

Real parts throughout: simulated vLLM replicas over HTTP writing vLLM-format request log lines,
the exporter polling them and following the log (divergence kinds through the replica's own
/detokenize). Only time is compressed: a 4 s diagnosis window, a 3 s cold start.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.diagnosis import TargetEvidence
from prefixwatch.core.vocab import causes
from prefixwatch.exporter.config import ConfigFlags, build_config
from prefixwatch.exporter.evidence import evidence_for
from prefixwatch.exporter.service import Exporter
from prefixwatch.simulator.driver import Driver
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.requestlog import RequestLogger
from prefixwatch.simulator.scenarios import SCENARIOS
from prefixwatch.simulator.server import Replica, ReplicaServer

WINDOW = 4.0


@dataclass
class Run:
    rounds: list[set[str]] = field(default_factory=list)  # active causes, all targets, per round
    per_target: list[dict[str, list[str]]] = field(default_factory=list)
    metrics: dict[str, list] = field(default_factory=dict)  # family name -> samples
    evidence: dict[str, TargetEvidence] = field(default_factory=dict)  # model -> last target's


def run_scenario(name: str, tmp_path, *, seconds: float = 8.0, rate: float = 20.0,
                 caching: bool = True, restart_at: float | None = None,
                 kv_cache_metrics: bool = False) -> Run:
    sc = SCENARIOS[name]
    cfg = EngineConfig(num_blocks=sc.num_blocks or 8192, prefill_tokens_per_s=1e5,
                       time_per_output_token=0.001, enable_prefix_caching=caching,
                       kv_cache_metrics=kv_cache_metrics, kv_cache_metrics_sample=1.0,
                       offload_blocks=sc.offload_blocks)
    log_path = os.path.join(tmp_path, f"{name}.log")
    stream = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    request_log = RequestLogger(stream)
    servers = [ReplicaServer(Replica(cfg, index=i, lora_modules=sc.lora_modules,
                                     request_log=request_log), "127.0.0.1", 0)
               for i in range(sc.replicas)]
    for s in servers:
        s.start()
    config = build_config(ConfigFlags(
        targets=[f"http://127.0.0.1:{s.port}/metrics" for s in servers], interval=0.5,
        listen_address="127.0.0.1:0", diagnosis_window=f"{WINDOW:g}s", cold_start="3s",
        requests_log={"path": log_path, "follow": True}), environ={})
    exporter = Exporter(config)
    driver = Driver([s.replica for s in servers], sc, rate, seed=5, restart_at=restart_at)
    run = Run()
    started = time.monotonic()
    driver.start()
    try:
        while time.monotonic() - started < seconds:
            exporter.poll_round()
            held = exporter.state.diagnosis.causes
            run.per_target.append({t: sorted(c for c, on in cs.items() if on)
                                   for (t, _m), cs in held.items()})
            run.rounds.append({c for cs in held.values() for c, on in cs.items() if on})
            time.sleep(0.5)
        page = generate_latest(exporter.registry).decode()
        for view in exporter.views():
            run.evidence.update(evidence_for(view, time.time(), WINDOW))
    finally:
        driver.stop()
        exporter.stop()
        for s in servers:
            s.stop()
        stream.close()
    for fam in text_string_to_metric_families(page):
        run.metrics[fam.name] = fam.samples
    return run


def settled(run: Run, rounds: int = 3) -> set[str]:
    """The causes of the last rounds, which must agree (a diagnosis that flaps is a bug)."""
    last = run.rounds[-rounds:]
    assert all(r == last[0] for r in last), f"diagnosis flaps: {last}"
    return last[0]


# Scenario -> the cause its runbook section names (docs/diagnosis.md's table is checked
# against this).
EXPECTED: dict[str, set[str]] = {
    "static-system-prompt": set(),
    "timestamp-at-top": {"prefix_divergence"},
    "timestamp-at-end": set(),
    "user-id-in-system": {"prefix_divergence"},
    "unordered-tools": {"prefix_divergence"},
    "rag-before-instructions": {"prefix_divergence"},
    "random-few-shots": {"prefix_divergence"},
    "short-prompts": {"short_prompts"},
    "lora-adapters": set(),
    "prefix-affinity": set(),
    # A host tier serves what the device pool evicts: healthy on the effective ratio.
    "offload-rescue": set(),
    # Every block stored to host memory, none asked for again: the tier idles.
    "offload-idle": {"prefix_divergence", "tier_idle"},
    # SGLang's manual table on vLLM's engine: a third of the prompts part at token 5.
    "three-layouts": {"prefix_divergence"},
}


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_scenario_diagnosis(name: str, tmp_path) -> None:
    extra = {"rate": 40.0, "seconds": 10.0} if SCENARIOS[name].replicas > 1 else {}
    run = run_scenario(name, tmp_path, **extra)
    assert settled(run) == EXPECTED[name]


@pytest.mark.integration
def test_pool_pressure_is_eviction(tmp_path) -> None:
    run = run_scenario("pool-pressure", tmp_path, rate=40.0, seconds=12.0)
    assert settled(run) == {"eviction_pressure"}


@pytest.mark.integration
def test_pool_pressure_with_vllms_kv_cache_metrics(tmp_path) -> None:
    """With --kv-cache-metrics the residency histograms corroborate it: cached blocks are
    evicted within seconds of their last use."""
    run = run_scenario("pool-pressure", tmp_path, rate=40.0, seconds=12.0,
                       kv_cache_metrics=True)
    assert settled(run) == {"eviction_pressure"}
    (ev,) = run.evidence.values()
    assert ev.evicted_blocks and ev.evicted_blocks > 100
    assert ev.evict_idle_median is not None and ev.evict_idle_median < 5.0


@pytest.mark.integration
@pytest.mark.parametrize("kv_cache_metrics", [False, True])
def test_round_robin_is_routing_spread_on_every_replica(tmp_path, kv_cache_metrics) -> None:
    """Evictions happen here too (each pool must hold every tenant), but no pool is full: the
    residency histograms must not turn routing into eviction pressure."""
    run = run_scenario("round-robin", tmp_path, rate=40.0, seconds=10.0,
                       kv_cache_metrics=kv_cache_metrics)
    assert settled(run) == {"routing_spread"}
    last = run.per_target[-1]
    assert len(last) == 2 and all(cs == ["routing_spread"] for cs in last.values())


@pytest.mark.integration
def test_caching_disabled(tmp_path) -> None:
    run = run_scenario("static-system-prompt", tmp_path, caching=False)
    assert settled(run) == {"caching_disabled"}


@pytest.mark.integration
def test_restart_is_cold_start_then_clears(tmp_path) -> None:
    run = run_scenario("static-system-prompt", tmp_path, restart_at=4.5, seconds=7.0)
    assert settled(run) == {"cold_start"}
    assert set() in run.rounds[:-4], "before the restart the diagnosis was clean"


@pytest.mark.integration
def test_exported_series(tmp_path) -> None:
    """The same run, read back from the exporter's own /metrics output."""
    run = run_scenario("timestamp-at-top", tmp_path)
    diag = {(s.labels["cause"]): s.value for s in run.metrics["prefixwatch_diagnosis"]}
    assert set(diag) == set(causes.CAUSE_NAMES)  # every cause pre-initialised
    assert {c for c, v in diag.items() if v == 1} == {"prefix_divergence"}
    achievable = [s for s in run.metrics["prefixwatch_achievable_hit_ratio"]]
    assert len(achievable) == 1 and achievable[0].value < 0.05
    assert achievable[0].labels["window"] == f"{WINDOW:g}s"
    top = [s.labels["kind"] for s in run.metrics["prefixwatch_prefix_divergence_top_kind"]]
    assert top == ["date/time"]
    buckets = {s.labels["le"]: s.value for s in run.metrics["prefixwatch_prefix_divergence_tokens"]
               if s.name.endswith("_bucket")}
    assert buckets["32.0"] == buckets["+Inf"] > 0  # the timestamp is on the first line
    lines = {s.labels["result"]: s.value for s in run.metrics["prefixwatch_requests_log_lines"]
             if s.name.endswith("_total")}
    assert lines["request"] > 50 and lines["skipped"] == 0


def test_readme_table_matches_the_tests() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "diagnosis.md").read_text()
    table = text.split("| scenario | diagnosed cause |", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| (`[^|]*?) \| (.*?) \|$", table, re.M))
    expected = {f"`{name}`": cs for name, cs in EXPECTED.items()}
    expected["`pool-pressure`"] = {"eviction_pressure"}
    expected["`round-robin`"] = {"routing_spread"}
    expected["`static-system-prompt`, `--no-prefix-caching`"] = {"caching_disabled"}
    expected["`static-system-prompt`, `--restart-at`"] = {"cold_start"}
    assert set(rows) == set(expected)
    for scenario, cell in rows.items():
        named = set(re.findall(r"`(\w+)`", cell))
        assert named == expected[scenario], scenario
    assert set(SCENARIOS) == {k.strip("`") for k in expected if "," not in k}


@pytest.mark.integration
def test_offload_rescue_is_healthy_on_the_effective_ratio(tmp_path) -> None:
    """The device pool serves under half, the host tier most of the rest: the exporter's
    effective ratio is above the threshold, the device one below, and nothing is diagnosed."""
    run = run_scenario("offload-rescue", tmp_path)
    assert settled(run) == set()
    window = "1m"  # the exporter's first window: the whole run

    def ratio(family: str) -> float:
        (value,) = [s.value for s in run.metrics[family] if s.labels["window"] == window]
        return value

    assert ratio("prefixwatch_effective_hit_ratio") > causes.DiagnosisThresholds().hit_ratio
    assert ratio("prefixwatch_prefix_cache_hit_ratio") < 0.6, ratio(
        "prefixwatch_effective_hit_ratio")
    host = [s.value for s in run.metrics["prefixwatch_prompt_tokens_cached"]
            if s.labels["tier"] == "host" and s.name.endswith("_total")]
    assert host and host[0] > 0
    (ev,) = run.evidence.values()
    assert ev.lower_hits > 0 and ev.tier_configured
