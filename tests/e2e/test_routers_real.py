"""The real routers (vllm-router 0.1.17, smg 1.13.0: ``pip install '.[routers]'``) on loopback
in front of two simulated vLLM replicas, over a workload of four tenants' long system prompts.

What routing cost is the KV event ledger's ``routing`` part (one exporter following both
replicas' streams); what the router believed is its own counters, what the engines delivered
theirs. With round-robin the routing part is a large share of the computed tokens; with
vllm-router's ``kv_aware`` and smg's ``cache_aware`` it is near zero. Cutting the router's KV
feed while a replica's cache is reset under it (replay off) opens the gap between believed
and delivered, and PrefixCacheRouterIndexStale fires within its (time-scaled) ``for``.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.vocab import rulenames
from prefixwatch.demo.routers import RouterProcess, spec_for
from prefixwatch.exporter.config import ExporterConfig, TargetConfig
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin import rules
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.kvpublisher import KVEventsOptions
from prefixwatch.simulator.scenarios import Corpus, _many_tenants
from prefixwatch.simulator.server import Replica, ReplicaServer
from prefixwatch.simulator.via import ViaRouter
from tests.conftest import free_port, require_binary, start_prometheus, wait_ready

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("routers")]

ENGINE = EngineConfig(prefill_tokens_per_s=2e5, time_per_output_token=0.001)
TENANTS = 4
REQUESTS = 24


def workload(seed: int = 3):
    """Request bodies: four tenants' ~1,800-token system prompts and a question each, without
    tool schemas (vllm-router's kv_aware tokenizes tool-bearing chats through a render endpoint
    vLLM's /tokenize does not offer: it then routes blind, ``missing_tokens``)."""
    make, rng, corpus = _many_tenants(TENANTS, max_tokens=8), random.Random(seed), Corpus.build()
    while True:
        body = dict(make(rng, corpus, datetime.now(UTC)).body)
        body.pop("tools", None)
        yield body


class Stack:
    """Two replicas publishing KV events, a router in front, an exporter following all three."""

    def __init__(self, kind: str, policy: str, tmp: Path, interval: float = 1.0) -> None:
        require_binary({"vllm-router": "vllm-router", "smg": "smg"}[kind],
                       "pip install '.[routers]'")
        self.sims = [ReplicaServer(Replica(ENGINE, index=i, kv_events=KVEventsOptions(
            "tcp://127.0.0.1:0")), "127.0.0.1", 0) for i in range(2)]
        for s in self.sims:
            s.start()
        self.workers = [f"http://127.0.0.1:{s.port}" for s in self.sims]
        kv = [(w, s.replica.kv_publisher.endpoint) for w, s in zip(self.workers, self.sims,
                                                                  strict=True)]
        self.router = RouterProcess(spec_for(kind, policy, (free_port(), free_port()),
                                             self.workers, kv, ENGINE.model),
                                    tmp / f"{kind}-{policy}.log").start()
        self.exporter = Exporter(ExporterConfig(targets=(
            *(TargetConfig(f"{w}/metrics", name=f"replica-{i}", kv_events=e)
              for i, (w, e) in enumerate(kv)),
            TargetConfig(self.router.spec.metrics_url, name="router", kind="router")),
            interval=interval, listen_address="127.0.0.1:0", windows=("1m",)))
        self.via = ViaRouter(self.router.spec.url, ENGINE.model)

    def start(self, serve: bool = False) -> Stack:
        self.router.wait_ready()
        if serve:
            self.exporter.start()
        else:
            self.exporter.kv.start()
        deadline = time.monotonic() + 10
        while not all(s.up for s in self.exporter.kv.sources.values()):
            assert time.monotonic() < deadline, "the exporter never subscribed"
            time.sleep(0.05)
        if not serve:
            self.exporter.poll_round()  # the event ledger's first edge: before any traffic
        return self

    def stop(self) -> None:
        self.via.close()
        self.exporter.stop()
        self.router.stop()
        for s in self.sims:
            s.stop()

    def samples(self) -> dict[tuple[str, tuple], float]:
        self.exporter.poll_round()
        out = {}
        for fam in text_string_to_metric_families(generate_latest(
                self.exporter.registry).decode()):
            for s in fam.samples:
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
        return out


def page(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()  # noqa: S310 - loopback
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(samples: dict, name: str, **match: str) -> float:
    return sum(v for (n, labels), v in samples.items()
               if n == name and all(dict(labels).get(k) == x for k, x in match.items()))


def measure(kind: str, policy: str, tmp: Path) -> dict[str, float]:
    """Send the workload through the router; the routing part's share of the computed tokens,
    believed and delivered as the exporter writes them, each checked against the router's and
    the engines' own counters."""
    stack = Stack(kind, policy, tmp).start()
    try:
        bodies = workload()
        for _ in range(REQUESTS):
            stack.via.send(next(bodies))
        time.sleep(0.3)  # the last events reach the exporter
        got = stack.samples()
        router = page(stack.router.spec.metrics_url)
        engines = [page(f"{w}/metrics") for w in stack.workers]
    finally:
        stack.stop()
    computed = total(got, "prefixwatch_kv_computed_tokens_total")
    routing = total(got, "prefixwatch_kv_computed_tokens_total", part="routing")
    hits = total(got, "prefixwatch_prefix_cache_hits_total")
    queries = total(got, "prefixwatch_prefix_cache_queries_total")
    # Delivered: the engines' own counters, exactly.
    assert hits == sum(total(e, "vllm:prefix_cache_hits_total") for e in engines)
    assert queries == sum(total(e, "vllm:prefix_cache_queries_total") for e in engines)
    # Believed: the router's own counters, exactly.
    predicted = total(got, "prefixwatch_router_predicted_hits_total")
    predictions = total(got, "prefixwatch_router_predictions_total")
    if kind == "vllm-router" and policy == "kv_aware":
        lookups = "vllm_router_kv_placement_lookups_total"
        assert predicted == total(router, lookups, result="hit")
        assert predictions == total(router, lookups)
    elif kind == "vllm-router" and policy == "cache_aware":
        decisions = "vllm_router_prefix_routing_decisions_total"
        assert predicted == total(router, decisions, outcome="prefix_hit")
        assert predictions == predicted + total(router, decisions, outcome="prefix_miss")
    elif kind == "smg" and policy == "cache_aware":
        assert predicted == total(router, "smg_cache_aware_match_ratio_sum")
        assert predictions == total(router, "smg_cache_aware_match_ratio_count")
    else:
        assert predictions == 0  # round-robin believes nothing
    sent = total(got, "prefixwatch_router_worker_requests_total")
    assert sent == REQUESTS, sent
    rungs = {rung: total(got, "prefixwatch_ladder_hit_ratio", window="1m", rung=rung)
             for rung in ("delivered", "perfect_routing", "ideal_prompts")}
    return {"ladder": rungs, "routing": routing / computed, "believed": predicted / predictions
            if predictions else float("nan"), "delivered": hits / queries,
            "routing_tokens": routing, "computed_tokens": computed, "prompt_tokens": queries}


def test_what_routing_cost_per_policy(tmp_path: Path) -> None:
    rr = measure("vllm-router", "round_robin", tmp_path)
    kv = measure("vllm-router", "kv_aware", tmp_path)
    smg = measure("smg", "cache_aware", tmp_path)
    assert rr["routing"] > 0.25, rr  # each prefix computed on both replicas
    assert kv["routing"] < 0.02, kv
    assert smg["routing"] < 0.02, smg
    assert kv["delivered"] > rr["delivered"] and smg["delivered"] > rr["delivered"]
    assert kv["believed"] > 0.5 and smg["believed"] > 0.5
    # The ladder: perfect routing wins back round-robin's routing part, nothing for kv_aware.
    gain = rr["ladder"]["perfect_routing"] - rr["ladder"]["delivered"]
    assert gain == pytest.approx(rr["routing_tokens"] / rr["prompt_tokens"]) and gain > 0.1, rr
    assert kv["ladder"]["perfect_routing"] == pytest.approx(kv["ladder"]["delivered"]), kv


def test_a_cut_kv_feed_opens_the_gap_and_pages(tmp_path: Path) -> None:
    """vllm-router kv_aware; after a healthy stretch the replica serving the traffic stops
    publishing (the router's feed is cut; replay off) and its cache is reset under it again
    and again: the router still believes it holds every prefix, the replica delivers far
    less, and the alert fires within router_window + router_for (time-scaled)."""
    prometheus = require_binary("prometheus", "prometheus")
    scale = 0.015
    cfg = MixinConfig(time_scale=scale)
    window = cfg.router_window
    stack = Stack("vllm-router", "kv_aware", tmp_path, interval=0.25).start(serve=True)
    rules_file = tmp_path / "prefixwatch.exporter.rules.yml"
    rules_file.write_text(rules.render("exporter", cfg))

    def prom_cfg(_self_address: str) -> dict:
        return {"global": {"scrape_interval": "250ms", "evaluation_interval": "250ms"},
                "rule_files": [str(rules_file)],
                "scrape_configs": [{"job_name": "prefixwatch", "static_configs": [
                    {"targets": [f"127.0.0.1:{stack.exporter.port}"]}]}]}

    prom = start_prometheus(prometheus, tmp_path / "prometheus.yml", prom_cfg,
                            f"--storage.tsdb.path={tmp_path / 'prom'}")
    stop = threading.Event()

    def traffic() -> None:
        bodies = workload(seed=5)
        while not stop.wait(0.08):
            with contextlib.suppress(OSError):  # one that met a reset: the next one counts
                stack.via.send(next(bodies))

    def query(expr: str) -> list:
        r = requests.get(f"{prom.url}/api/v1/query", params={"query": expr}, timeout=5)
        return r.json()["data"]["result"]

    sender = threading.Thread(target=traffic, daemon=True)
    try:
        wait_ready(f"{prom.url}/-/ready", prom.proc)
        sender.start()
        gap = rulenames.r_router_gap(window)
        deadline = time.monotonic() + 15
        while not query(rulenames.r_router_delivered(window)) and time.monotonic() < deadline:
            time.sleep(0.25)
        time.sleep(2.0)
        healthy = query(gap)
        assert healthy and float(healthy[0]["value"][1]) < cfg.router_gap, healthy
        assert not query(f'ALERTS{{alertname="{rulenames.ALERT_ROUTER_STALE}"}}')
        # The replica the router chose: the one with the traffic.
        sent = stack.samples()
        busy = max(range(2), key=lambda i: total(
            sent, "prefixwatch_router_worker_requests_total", worker=stack.workers[i]))
        stack.sims[busy].replica.kv_publisher.stop()  # the router's feed is cut
        cut = time.monotonic()
        limit = (60 * (5 + 10) * scale) + 25  # router_window + router_for, scaled, + slack
        firing: list = []
        while time.monotonic() - cut < limit and not firing:
            stack.sims[busy].replica.engine.reset_prefix_cache()
            firing = query(f'ALERTS{{alertname="{rulenames.ALERT_ROUTER_STALE}",'
                           'alertstate="firing"}')
            time.sleep(0.2)
        assert firing, f"not firing {time.monotonic() - cut:.1f}s after the cut: {query(gap)}"
        print(f"gap before the cut {float(healthy[0]['value'][1]):.3f}; firing "
              f"{time.monotonic() - cut:.1f}s after it, gap {query(gap)[0]['value'][1]}")
        assert firing[0]["metric"]["router"] == "router"
        assert time.monotonic() - cut >= 60 * 10 * scale  # not before its for:
    finally:
        stop.set()
        sender.join(timeout=5)
        prom.proc.terminate()
        prom.proc.wait(timeout=10)
        stack.stop()


def main() -> None:
    """Print the table of docs/routers.md: `python -m tests.e2e.test_routers_real`."""
    import tempfile

    runs = (("vllm-router", "round_robin"), ("vllm-router", "cache_aware"),
            ("vllm-router", "kv_aware"), ("smg", "round_robin"), ("smg", "cache_aware"))
    print("| router | policy | routing part (tokens) | of computed | believed | delivered |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for kind, policy in runs:
            m = measure(kind, policy, Path(tmp))
            believed = "-" if m["believed"] != m["believed"] else f"{m['believed']:.1%}"
            print(f"| {kind} | `{policy}` | {m['routing_tokens']:,.0f} | {m['routing']:.1%} | "
                  f"{believed} | {m['delivered']:.1%} |")


if __name__ == "__main__":
    main()
