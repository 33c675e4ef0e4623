"""The pool what-if end to end: a simulated replica with a small pool publishes its KV events,
the exporter follows them and reads the pool size from the replica's vllm:cache_config_info,
and its what-if counters, divided by its prompt tokens, are the hit ratios the same requests
get from replicas with 1.5x and 2x the pool (run in-process, one request at a time as here).

Real sockets and HTTP on 127.0.0.1, ports 0; every wait is bounded.
"""

from __future__ import annotations

import random
import time

import pytest
import requests

from prefixwatch.exporter.config import ExporterConfig, TargetConfig
from prefixwatch.exporter.service import Exporter
from prefixwatch.simulator import poolcheck
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.kvpublisher import KVEventsOptions
from prefixwatch.simulator.server import Replica, ReplicaServer
from tests.e2e.test_kv_stream_e2e import scrape, value, wait_for

POOL = 160
MODEL = EngineConfig().model


def workload(n: int = 60) -> list[tuple[list[int], int]]:
    """Six 40-block system prompts, Zipf popularity, a fresh question each: 240 blocks
    of system prompts for a 160-block pool."""
    rng = random.Random(3)
    systems = [[rng.randrange(100, 30_000) for _ in range(640)] for _ in range(6)]
    weights = [1 / (i + 1) for i in range(6)]
    out = []
    for _ in range(n):
        system = rng.choices(systems, weights)[0]
        out.append((system + [rng.randrange(100, 30_000) for _ in range(rng.randint(20, 60))],
                    4))
    return out


@pytest.mark.integration
def test_the_exporters_what_if_is_the_larger_pools_hit_ratio() -> None:
    work = workload()
    cfg = EngineConfig(num_blocks=POOL, prefill_tokens_per_s=2e5, time_per_output_token=0.001)
    sim = ReplicaServer(Replica(cfg, kv_events=KVEventsOptions("tcp://127.0.0.1:0")),
                        "127.0.0.1", 0)
    sim.start()
    target = TargetConfig(f"http://127.0.0.1:{sim.port}/metrics", name="r0",
                          kv_events=sim.replica.kv_publisher.endpoint)
    exporter = Exporter(ExporterConfig(targets=(target,), interval=0.3,
                                       listen_address="127.0.0.1:0"))
    exporter.start()
    try:
        wait_for(lambda: value(scrape(exporter.port), "prefixwatch_kv_events_up",
                               target="r0") == 1.0, what="the stream up")
        wait_for(lambda: value(scrape(exporter.port), "prefixwatch_kv_pool_blocks",
                               target="r0") == POOL, what="the pool size from the page")
        time.sleep(1.0)  # the subscription reaches the publisher
        for prompt, max_tokens in work:
            r = requests.post(f"http://127.0.0.1:{sim.port}/v1/completions",
                              json={"prompt": prompt, "max_tokens": max_tokens}, timeout=10)
            assert r.status_code == 200

        prompt_tokens = sum(len(p) for p, _ in work)

        def settled() -> bool:
            got = scrape(exporter.port)
            return value(got, "prefixwatch_prompt_tokens_total", target="r0",
                         model_name=MODEL, engine="0", server="vllm") == prompt_tokens
        wait_for(settled, what="every request polled")
        time.sleep(0.8)  # the stream and the counters at rest, two more polls
        got = scrape(exporter.port)
        for scale in ("1.5", "2"):
            whatif = value(got, "prefixwatch_kv_whatif_cached_tokens_total", target="r0",
                           model_name=MODEL, pool_scale=scale)
            assert whatif is not None
            delivered = poolcheck.run(round(POOL * float(scale)), work)
            assert delivered.prompt == prompt_tokens
            assert abs(whatif / prompt_tokens - delivered.ratio) <= 0.03, (scale, whatif,
                                                                           delivered)
        # The routers' ladder takes its capacity rung from the what-if at 2x the pool: one
        # replica, no routing part, so the rung is that pool's hit ratio.
        ladder = [v for (name, labels), v in got.items()
                  if name == "prefixwatch_ladder_hit_ratio" and ("rung", "capacity") in labels]
        assert ladder, "the ladder has a capacity rung"
        twice = poolcheck.run(2 * POOL, work).ratio
        assert all(abs(v - twice) <= 0.05 for v in ladder), (ladder, twice)
        base = poolcheck.run(POOL, work)
        assert poolcheck.run(2 * POOL, work).ratio - base.ratio > 0.1  # a real curve
        # The landing page draws the curve and says it in words.
        page = requests.get(f"http://127.0.0.1:{exporter.port}/", timeout=5).text
        assert "How much memory would win it back" in page and "class=\"poolcurve\"" in page
        assert f"instead of {base.ratio:.0%}" in page
        # The same sentence for the replica, as the diagnosis' log line gives it with
        # eviction_pressure.
        words = exporter.kv_ledgers.whatif.target_words("r0", None)
        assert words is not None and words.endswith(")") and "the KV pool" in words
    finally:
        exporter.stop()
        sim.stop()
