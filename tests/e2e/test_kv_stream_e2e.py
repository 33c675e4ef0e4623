"""The simulator's KV event stream reaches the exporter: two simulated replicas publish on free
ports, the exporter subscribes to each (``kv_events`` per target), a few requests share a system
prompt round-robin, and the exporter's block counts and computed-token parts equal what the
simulator's own pools and responses say.

Real sockets and HTTP on 127.0.0.1, ports 0; every wait is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.vocab import exposition
from prefixwatch.exporter.config import ExporterConfig, TargetConfig
from prefixwatch.exporter.service import Exporter
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.kvpublisher import KVEventsOptions
from prefixwatch.simulator.server import Replica, ReplicaServer

BS = 16
SYSTEM = [5_000 + j for j in range(40)]  # two full blocks and 8 tokens of a third
SUFFIX = 21  # each prompt: 61 tokens, 3 full blocks and a 13-token tail


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def wait_for_ledgers(exporter: Exporter, truth: dict[str, dict], requests: int,
                     output: bool = False) -> None:
    """Until each target's event ledger holds its truth's prompt tokens over ``requests``
    requests (and its output tokens, with ``output``), then two more polls: the stream and
    the counters at rest."""
    def settled() -> bool:
        for t, row in truth.items():
            span = exporter.kv_ledgers.span(t, None)
            if span is None or span.prompt != row["prompt"] or span.requests != requests:
                return False
            if output and span.shares[exposition.LEDGER_OUTPUT] != row["output"]:
                return False
        return True

    wait_for(settled, what="every request finished and polled")
    time.sleep(0.7)


def value(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def wait_for(check, seconds: float = 20.0, what: str = "") -> None:
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"within {seconds:g} s: {what} ({got!r})")
        time.sleep(0.2)


@contextmanager
def replicas_and_exporter(cfg: EngineConfig, server: str = "vllm"
                          ) -> Iterator[tuple[list[ReplicaServer], tuple[TargetConfig, ...],
                                              Exporter]]:
    """Two simulated replicas (of ``server``) publishing on free ports, and an exporter
    subscribed to both (and polled once, so the ledger's baseline is there) before any
    request: PUB drops what it sends before a subscription arrives."""
    sims = [ReplicaServer(Replica(cfg, index=i, server=server,
                                  kv_events=KVEventsOptions("tcp://127.0.0.1:0")),
                          "127.0.0.1", 0) for i in range(2)]
    for s in sims:
        s.start()
    targets = tuple(TargetConfig(f"http://127.0.0.1:{s.port}/metrics", name=f"r{i}",
                                 kv_events=s.replica.kv_publisher.endpoint)
                    for i, s in enumerate(sims))
    exporter = Exporter(ExporterConfig(targets=targets, interval=0.3,
                                       listen_address="127.0.0.1:0"))
    exporter.start()
    try:
        wait_for(lambda: all(value(scrape(exporter.port), "prefixwatch_kv_events_up",
                                   target=t.name) == 1.0 for t in targets),
                 what="both streams up")
        wait_for(lambda: all(exporter.kv_ledgers.span(t.name, None) is not None
                             for t in targets), what="both ledgers' baselines")
        time.sleep(1.0)  # the subscriptions reach the publishers
        yield sims, targets, exporter
    finally:
        exporter.stop()
        for s in sims:
            s.stop()


@pytest.mark.integration
def test_the_simulators_stream_reaches_the_exporter_and_matches_its_pools() -> None:
    cfg = EngineConfig(prefill_tokens_per_s=2e5, time_per_output_token=0.002)
    with replicas_and_exporter(cfg) as (sims, targets, exporter):
        cached: dict[str, list[int]] = {"r0": [], "r1": []}
        for k in range(4):
            i = k % 2
            prompt = SYSTEM + [9_000 + 100 * k + j for j in range(SUFFIX)]
            r = requests.post(f"http://127.0.0.1:{sims[i].port}/v1/completions",
                              json={"prompt": prompt, "max_tokens": 1}, timeout=10)
            assert r.status_code == 200
            cached[f"r{i}"].append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
            time.sleep(0.2)  # one request at a time: r1's first sees r0's blocks
        prompt_len = len(SYSTEM) + SUFFIX
        full = prompt_len // BS

        def pools_match() -> bool:
            got = scrape(exporter.port)
            for i, s in enumerate(sims):
                t, pool = f"r{i}", s.replica.engine.pool
                resident = sum(node is not None for node in pool.node_of)
                if (value(got, "prefixwatch_kv_blocks_total", target=t, medium="GPU",
                          op="removed") != pool.evictions
                        or value(got, "prefixwatch_kv_blocks_total", target=t, medium="GPU",
                                 op="stored") != resident + pool.evictions
                        or value(got, "prefixwatch_kv_resident_blocks", target=t,
                                 medium="GPU") != resident
                        or value(got, "prefixwatch_kv_computed_tokens_total", target=t,
                                 model_name=cfg.model, part=exposition.LEDGER_TAIL)
                        != 2 * (prompt_len - full * BS)):
                    return False
            return True

        wait_for(pools_match, what="the exporter's blocks equal the simulator's pools")
        got = scrape(exporter.port)
        for t in ("r0", "r1"):
            parts = {p: value(got, "prefixwatch_kv_computed_tokens_total", target=t,
                              model_name=cfg.model, part=p)
                     for p in exposition.KV_COMPUTED_SERIES_PARTS}
            # Every full block a request did not get from the cache was computed, and stored.
            computed = sum(full * BS - c for c in cached[t])
            recomputed = sum(v for p, v in parts.items() if p != exposition.LEDGER_TAIL)
            assert recomputed == computed, parts
            assert value(got, "prefixwatch_kv_events_lost_total", target=t) == 0.0
            assert parts["eviction"] == 0.0
        # r1's first request found the system prompt's two blocks on r0: routing, not novel.
        assert cached["r1"][0] == 0 and cached["r1"][1] == 2 * BS
        assert value(got, "prefixwatch_kv_computed_tokens_total", target="r1",
                     model_name=cfg.model, part="routing") == 2 * BS
        assert value(got, "prefixwatch_kv_computed_tokens_total", target="r0",
                     model_name=cfg.model, part="routing") == 0.0
        # The landing page shows the streams and the ledger from them.
        page = requests.get(f"http://127.0.0.1:{exporter.port}/", timeout=5).text
        assert "KV event streams" in page and "from the KV event" in page


@pytest.mark.integration
def test_a_workload_with_answers_closes_the_event_ledger_with_the_output_named() -> None:
    """Answers of 24 to 56 tokens: vLLM caches their blocks too, so the stream holds more
    than the prompts' blocks. The exporter's ledger closes to the token (unexplained 0) with
    the generated tokens whose KV was computed as the output part, the engine's own count."""
    cfg = EngineConfig(prefill_tokens_per_s=2e5, time_per_output_token=0.002)
    with replicas_and_exporter(cfg) as (sims, targets, exporter):
        truth = {t.name: {"prompt": 0, "cached": 0, "output": 0, "stored": 0, "requests": 0}
                 for t in targets}
        for k in range(8):
            i, answer = k % 2, 24 + 8 * (k % 5)
            prompt = SYSTEM + [9_000 + 100 * k + j for j in range(SUFFIX + 7 * k)]
            r = requests.post(f"http://127.0.0.1:{sims[i].port}/v1/completions",
                              json={"prompt": prompt, "max_tokens": answer}, timeout=10)
            assert r.status_code == 200
            usage = r.json()["usage"]
            cached = usage["prompt_tokens_details"]["cached_tokens"]
            assert usage["completion_tokens"] == answer
            row = truth[f"r{i}"]
            row["prompt"] += len(prompt)
            row["cached"] += cached
            row["output"] += answer - 1  # the last sampled token is never fed back
            row["stored"] += (len(prompt) + answer - 1) // BS - cached // BS
            row["requests"] += 1
            time.sleep(0.1)

        wait_for_ledgers(exporter, truth, 8 // 2, output=True)
        got = scrape(exporter.port)
        for t, row in truth.items():
            # The simulator stored each answer's blocks where vLLM does: the stream holds them.
            assert value(got, "prefixwatch_kv_blocks_total", target=t, medium="GPU",
                         op="stored") == row["stored"]
            span = exporter.kv_ledgers.span(t, None)
            assert span is not None
            shares = span.shares
            print(t, span.prompt, shares)
            assert shares["unexplained"] == 0, shares
            assert shares["achieved"] == row["cached"]
            assert shares[exposition.LEDGER_OUTPUT] == row["output"]
            assert 0 <= shares[exposition.LEDGER_TAIL] <= (BS - 1) * row["requests"]
            assert sum(shares[p] for p in exposition.KV_LEDGER_SHARES) == span.prompt
            assert all(shares[p] >= 0 for p in exposition.KV_LEDGER_SHARES), shares
        model = cfg.model
        assert value(got, "prefixwatch_ledger_tokens_total", model_name=model,
                     part=exposition.LEDGER_OUTPUT) == sum(r["output"] for r in truth.values())
        page = requests.get(f"http://127.0.0.1:{exporter.port}/", timeout=5).text
        assert "output " in page and "generated tokens" in page
