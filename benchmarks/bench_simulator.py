"""Simulator throughput on 2,400-token prompts, against the obvious per-block loop.

Target (issue 3): at least 200 requests/s of 2,400-token prompts per replica. The baseline,
run on the same requests in the same process, is the loop a runbook would show: chained
`hash((parent, tuple(block)))` per block, a dict of cached hashes, an LRU of them.
Both include the work of looking up, caching and freeing; ours also runs vLLM's full
bookkeeping (reference counts, free queue, metrics events, scheduling in virtual time).

Run: python benchmarks/bench_simulator.py [--requests 3000]
"""

from __future__ import annotations

import argparse
import random
import time
from collections import OrderedDict

from prefixwatch.simulator.engine import Engine, EngineConfig, VirtualClock
from prefixwatch.simulator.metrics import PageMetrics


def workload(n: int, seed: int = 3) -> list[list[int]]:
    """2,000 shared system-prompt tokens + 400 varied user tokens, as a chat workload."""
    rng = random.Random(seed)
    system = [rng.randrange(256, 128000) for _ in range(2000)]
    return [system + [rng.randrange(256, 128000) for _ in range(400)] for _ in range(n)]


def naive(prompts: list[list[int]], block_size: int = 16, capacity: int = 8191) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = queries = 0
    for prompt in prompts:
        parent = None
        hashes = []
        for i in range(0, len(prompt) - len(prompt) % block_size, block_size):
            parent = hash((parent, tuple(prompt[i:i + block_size])))
            hashes.append(parent)
        limit = (len(prompt) - 1) // block_size
        hit = 0
        for h in hashes[:limit]:
            if h not in cache:
                break
            cache.move_to_end(h)
            hit += 1
        for h in hashes:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > capacity:
            cache.popitem(last=False)
        queries += len(prompt)
        hits += hit * block_size
    return hits / queries


def ours(prompts: list[list[int]]) -> float:
    clock = VirtualClock()
    engine = Engine(EngineConfig(num_blocks=8192, time_per_output_token=0.0001,
                                 prefill_tokens_per_s=1e12), clock=clock)
    PageMetrics(engine)  # the /metrics bookkeeping runs on every request too
    for prompt in prompts:
        engine.submit(prompt, 1)
        engine.step()
        clock.now += 0.001
        engine.step()
    return engine.stats.prefix_hits / engine.stats.prefix_queries


def timed(fn, prompts) -> tuple[float, float]:
    start = time.perf_counter()
    ratio = fn(prompts)
    return time.perf_counter() - start, ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000)
    args = p.parse_args()
    prompts = workload(args.requests)
    timed(ours, prompts[:200])  # warm-up
    t_naive, r_naive = timed(naive, prompts)
    t_ours, r_ours = timed(ours, prompts)
    print(f"{args.requests} requests of 2,400 tokens (2,000 shared), one replica")
    print(f"baseline per-block hash(tuple) loop: {args.requests / t_naive:8.0f} req/s "
          f"(hit rate {r_naive:.3f})")
    print(f"prefixwatch simulator engine:        {args.requests / t_ours:8.0f} req/s "
          f"(hit rate {r_ours:.3f}), target >= 200 req/s")
    print(f"ratio simulator / baseline: {t_naive / t_ours:.2f}x the baseline's speed")


if __name__ == "__main__":
    main()
