"""The exporter's ledger against the simulator's truth, scenario by scenario, over HTTP.

Simulated vLLM replicas serve a scenario's requests and write a request log (vLLM's own lines
for one replica; a gateway's JSONL fleet log with the replica of each request for several);
the exporter polls their /metrics (achieved = the engines' cached tokens; the pool size from
cache_config_info) and follows the log. The simulator records, from its own state, where
every token of every request went (``simulator/truth.py``). Each part of the exporter's
ledger must be within 1 point of the prompt tokens of the truth's, ``unexplained`` within 1
point of 0, and the parts must add up to the token.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import threading
import time
from datetime import datetime

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.cache.requestledger import Parts, shares
from prefixwatch.exporter.config import ConfigFlags, build_config
from prefixwatch.exporter.service import Exporter
from prefixwatch.simulator import scenarios
from prefixwatch.simulator.driver import Driver
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.requestlog import RequestLogger
from prefixwatch.simulator.scenarios import SCENARIOS, Corpus, Scenario, Work
from prefixwatch.simulator.server import Replica, ReplicaServer
from prefixwatch.simulator.truth import LedgerTruth

PARTS = ("achieved", "novel", "layout", "routing", "eviction", "unexplained")
_tenants = scenarios._many_tenants(24)


def _mix(rng: random.Random, c: Corpus, now: datetime) -> Work:
    """One request in three has a timestamp at the top (layout), the others are 24 tenants'
    (routing over 2 replicas, eviction in pools too small for every tenant)."""
    if rng.random() < 1 / 3:
        return scenarios._timestamp_top(rng, c, now)
    return _tenants(rng, c, now)


CASES: dict[str, Scenario] = {
    "static": SCENARIOS["static-system-prompt"],
    "timestamp-at-top": SCENARIOS["timestamp-at-top"],
    "user-id": SCENARIOS["user-id-in-system"],
    "round-robin-2": SCENARIOS["round-robin"],
    "round-robin-4": dataclasses.replace(SCENARIOS["round-robin"], replicas=4),
    "pool-pressure": SCENARIOS["pool-pressure"],
    "mix": Scenario("mix", "timestamps, routing and eviction at known proportions", "mixed",
                    _mix, replicas=2, routing="round-robin", num_blocks=1800),
}


class _Following(logging.Handler):
    """Set when the exporter's reader follows the log: lines written before that are history
    (they fill the window but are not counted), so the driver waits for it."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "following from byte" in record.getMessage() and self.path in record.getMessage():
            self.event.set()


@dataclasses.dataclass
class Outcome:
    exporter: dict[str, int]  # the six shares in tokens, plus prompt
    truth: dict[str, int]
    ratios: dict[str, float]  # one window's prefixwatch_ledger_ratio
    requests: int


def run_case(name: str, tmp_path, seconds: float = 5.0, rate: float = 25.0) -> Outcome:
    sc = CASES[name]
    cfg = EngineConfig(num_blocks=sc.num_blocks or 8192, prefill_tokens_per_s=1e5,
                       time_per_output_token=0.001)
    log_path = os.path.join(tmp_path, f"{name}.log")
    stream = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    request_log = RequestLogger(stream, fmt="jsonl" if sc.replicas > 1 else "vllm")
    servers = [ReplicaServer(Replica(cfg, index=i, request_log=request_log), "127.0.0.1", 0)
               for i in range(sc.replicas)]
    for s in servers:
        s.start()
    config = build_config(ConfigFlags(
        targets=[f"http://127.0.0.1:{s.port}/metrics" for s in servers], interval=0.5,
        listen_address="127.0.0.1:0", diagnosis_window="60s", cold_start="1s",
        requests_log={"path": log_path, "follow": True, "tokenizer": "none"}), environ={})
    exporter = Exporter(config)
    truth = LedgerTruth(cfg.block_size)
    driver = Driver([s.replica for s in servers], sc, rate, seed=3, truth=truth)
    following = _Following(log_path)
    reader_log = logging.getLogger("prefixwatch.requests")
    reader_log.addHandler(following)
    old_level = reader_log.level
    reader_log.setLevel(logging.INFO)
    try:
        exporter.poll_round()  # block size and pool size known, the log followed from here
        assert following.event.wait(10), "the exporter did not start following the log"
        driver.start()
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            exporter.poll_round()
            time.sleep(0.5)
        driver.stop()
        expected = truth.totals()
        assert exporter.view is not None
        deadline = time.monotonic() + 20
        while exporter.view.ledger_totals()[0].requests < expected.requests:
            assert time.monotonic() < deadline, "the exporter did not read the whole log"
            time.sleep(0.1)
        exporter.poll_round()  # the engines' counters after the last request
        page = generate_latest(exporter.registry).decode()
    finally:
        reader_log.removeHandler(following)
        reader_log.setLevel(old_level)
        driver.stop()
        exporter.stop()
        for s in servers:
            s.stop()
        stream.close()
    fams = {f.name: f.samples for f in text_string_to_metric_families(page)}
    tokens = {s.labels["part"]: int(s.value) for s in fams["prefixwatch_ledger_tokens"]}
    hits = sum(int(s.value) for s in fams["prefixwatch_prefix_cache_hits"]
               if s.name.endswith("_total"))
    ratios = {s.labels["part"]: s.value for s in fams["prefixwatch_ledger_ratio"]
              if s.labels["window"] == "5m"}
    got = Parts(tokens["prompt"], tokens["novel"], tokens["layout"], tokens.get("routing", 0),
                tokens.get("eviction", 0), tokens["pool_reach"], hits, expected.requests)
    return Outcome({"prompt": got.prompt, **shares(got)},
                   {"prompt": expected.prompt, **shares(expected)}, ratios, expected.requests)


def ledger_table(name: str, out: Outcome) -> str:
    p = out.exporter["prompt"]
    cells = "  ".join(f"{k} {100 * out.exporter[k] / p:5.1f}/{100 * out.truth[k] / p:5.1f}"
                      for k in PARTS)
    tokens = " ".join(f"{k}={out.exporter[k]}" for k in PARTS)
    return (f"{name:17s} {out.requests:4d} req {p:7d} tok  {cells}  (exporter/truth %)\n"
            f"{'':17s} exporter tokens: {tokens}")


@pytest.mark.integration
@pytest.mark.parametrize("name", list(CASES))
def test_ledger_matches_the_simulators_truth(name: str, tmp_path) -> None:
    out = run_case(name, tmp_path)
    print(ledger_table(name, out))
    got, want = out.exporter, out.truth
    assert got["prompt"] == want["prompt"] > 0
    assert sum(got[k] for k in PARTS) == got["prompt"]  # to the token
    assert sum(want[k] for k in PARTS) == want["prompt"]
    for part in PARTS:
        assert abs(got[part] - want[part]) <= 0.01 * got["prompt"], (part, got, want)
    assert want["unexplained"] == 0
    assert abs(sum(out.ratios.values()) - 1.0) < 1e-9, out.ratios
