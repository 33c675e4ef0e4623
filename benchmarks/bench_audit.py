"""Audit throughput on a log of 10,000 requests of ~2,400 tokens, against the naive loop.

The baseline, run on the same pre-generated requests in the same process, is the runbook's naive
loop: per-block `hash(tuple(block))` chained over the prompt, a set of seen hashes for the
cacheable tokens, and a token-by-token first-divergence against the most common prefix.
Target: 10x. The prompts are generated once, before any timing, so neither side pays for them;
each side runs --repeat times, interleaved, and the best run of each is compared (a shared
machine only ever adds time).

Two figures for prefixwatch: the prefix index alone (core/cache/prefixindex.py, the exact radix trie
that answers the same question as the naive loop: cacheable tokens and where each prompt
diverges), and the whole Auditor, which also keeps the report and the hit-rate ledger.

prefixwatch is imported inside the functions that time it, so bench_audit_e2e.py's naive
process can take ``workload`` and ``naive`` from here with the standard library alone.

Run: python benchmarks/bench_audit.py [--requests 10000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections import Counter
from collections.abc import Iterator

BLOCK = 16


def workload(n: int, seed: int = 5) -> Iterator[list[int]]:
    """Chat-like prompts: one of 4 system prompts (2,000 tokens), a third of them with a
    timestamp near the top, then a 400-token user turn."""
    rng = random.Random(seed)
    systems = [[rng.randrange(256, 128000) for _ in range(2000)] for _ in range(4)]
    for i in range(n):
        prompt = list(systems[i % 4])
        if i % 3 == 0:
            prompt[10:14] = [i % 60, (i // 60) % 60, 7, 9]  # a time of day
        prompt += [rng.randrange(256, 128000) for _ in range(400)]
        yield prompt


def naive(prompts: list[list[int]]) -> tuple[int, int]:
    """The seed's loop, unchanged but for taking the prompts instead of generating them."""
    seen: set[int] = set()
    first_blocks: Counter = Counter()
    reference: dict[int, list[int]] = {}
    cacheable = total = 0
    for prompt in prompts:
        h = None
        hashes = []
        for i in range(0, len(prompt) - len(prompt) % BLOCK, BLOCK):
            h = hash((h, tuple(prompt[i:i + BLOCK])))
            hashes.append(h)
        limit = (len(prompt) - 1) // BLOCK
        hit = 0
        for x in hashes[:limit]:
            if x not in seen:
                break
            hit += 1
        cacheable += hit * BLOCK
        total += len(prompt)
        seen.update(hashes)
        # First divergence against the most common prefix (by first block).
        if hashes:
            first_blocks[hashes[0]] += 1
            common = first_blocks.most_common(1)[0][0]
            ref = reference.setdefault(common, prompt)
            k = 0
            while k < min(len(ref), len(prompt)) and ref[k] == prompt[k]:
                k += 1
    return cacheable, total


def index_only(prompts: list[list[int]]) -> tuple[int, int]:
    """The index as the audit runs it: with the Auditor's garbage-collector policy (its
    long-lived edges moved out of the collector's way every FREEZE_EVERY requests)."""
    from prefixwatch.audit.analysis import Auditor
    from prefixwatch.core.cache.prefixindex import PrefixIndex

    index = PrefixIndex(BLOCK)
    cacheable = total = 0
    for i, prompt in enumerate(prompts, 1):
        if i % Auditor.FREEZE_EVERY == 0:
            gc.freeze()
        result = index.add(prompt)
        cacheable += result.cacheable_tokens
        total += result.prompt_tokens
    return cacheable, total


def auditor(prompts: list[list[int]]) -> tuple[int, int]:
    from prefixwatch.audit.analysis import Auditor

    audit = Auditor(BLOCK)
    for prompt in prompts:
        audit.add(prompt)
    return audit.report.cacheable_tokens, audit.report.prompt_tokens


def best(fn, prompts: list[list[int]], runs: list[float]) -> tuple[int, int]:
    gc.unfreeze()  # what the previous run froze is garbage now: collect it, keep the input
    gc.collect()
    gc.freeze()
    start = time.perf_counter()
    result = fn(prompts)
    runs.append(time.perf_counter() - start)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    prompts = list(workload(args.requests))
    gc.collect()
    gc.freeze()  # the input is neither side's work: keep the collector from rescanning it
    times: dict[str, list[float]] = {"naive": [], "index": [], "auditor": []}
    results = set()
    for _ in range(args.repeat):
        results.add(best(naive, prompts, times["naive"]))
        results.add(best(index_only, prompts, times["index"]))
        results.add(best(auditor, prompts, times["auditor"]))
    assert len(results) == 1, results  # all three agree on the cacheable tokens
    cacheable, tokens = results.pop()
    t_naive, t_index, t_audit = (min(times[k]) for k in ("naive", "index", "auditor"))
    per = 1e6 / len(prompts)
    print(f"{len(prompts)} requests, {tokens:,} tokens, best of {args.repeat} runs each")
    print(f"achievable hit rate: {cacheable / tokens:.3f} (all agree)")
    print(f"baseline naive loop:  {tokens / t_naive / 1e6:6.2f} M tokens/s  "
          f"{t_naive * per:6.0f} us/request")
    print(f"prefix index:         {tokens / t_index / 1e6:6.2f} M tokens/s  "
          f"{t_index * per:6.0f} us/request  {t_naive / t_index:5.1f}x (target 10x)")
    print(f"whole Auditor:        {tokens / t_audit / 1e6:6.2f} M tokens/s  "
          f"{t_audit * per:6.0f} us/request  {t_naive / t_audit:5.1f}x (report and ledger)")


if __name__ == "__main__":
    main()
