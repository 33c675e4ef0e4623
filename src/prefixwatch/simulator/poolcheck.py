"""The pool what-if checked against the simulator: one workload at several pool sizes.

A scenario's requests (seeded, timestamps from a fixed clock) run one at a time through a
simulated replica at the base pool and at each larger one. The base run's KV event stream goes
through the exporter's own decode and mirror (``core/kv/mirror.py``, its what-if in
``core/kv/whatif.py``), which says what each larger pool would have served; each larger run
says what it did serve. The tests and ``benchmarks/bench_pool_whatif.py`` compare the two.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from prefixwatch.core.kv.codec import BatchDecoder
from prefixwatch.core.kv.mirror import FleetContent, TargetMirror
from prefixwatch.simulator.driver import tokenize_work
from prefixwatch.simulator.engine import Engine, EngineConfig, VirtualClock
from prefixwatch.simulator.kvpublisher import KVEvents, KVEventSink, encode_batch
from prefixwatch.simulator.scenarios import SCENARIOS, Corpus
from prefixwatch.simulator.server import Replica

#: The fixed clock the scenarios' timestamps read (one second per request).
EPOCH = datetime(2025, 1, 1, 12, 0, 0)


@dataclass
class PoolRun:
    """One run: prompt tokens, cached tokens, and (the base run) the what-if by scale."""

    blocks: int
    prompt: int = 0
    cached: int = 0
    whatif: dict[str, int] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.cached / self.prompt if self.prompt else float("nan")

    def whatif_ratio(self, scale: str) -> float:
        return (self.cached + self.whatif[scale]) / self.prompt if self.prompt else float("nan")


class _Batches:
    """A publisher that keeps each step's batch as the bytes vLLM would send."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def publish(self, events: list) -> None:
        self.payloads.append(encode_batch(events, ts=0.0))

    def restart(self) -> None:
        self.payloads.clear()


def requests(scenario: str, count: int, seed: int = 1) -> list[tuple[list[int], int]]:
    """``count`` requests of a scenario as (prompt token ids, max_tokens), deterministic."""
    sc = SCENARIOS[scenario]
    replica = Replica(EngineConfig())  # its tokenizer and chat template only
    rng = random.Random(seed)
    corpus = Corpus.build()
    out = []
    for i in range(count):
        work = sc.make(rng, corpus, EPOCH + timedelta(seconds=i))
        prompt, _text = tokenize_work(replica, work.body)
        out.append((prompt, int(work.body.get("max_tokens", 16))))
    return out


def run(blocks: int, work: Iterable[tuple[list[int], int]], whatif: bool = False,
        block_size: int = 16, together: int = 1) -> PoolRun:
    """The requests ``together`` at a time (1: one at a time) on a pool of ``blocks``; with
    ``whatif``, its stream mirrored and the what-if read at the end."""
    engine = Engine(EngineConfig(num_blocks=blocks, block_size=block_size),
                    clock=VirtualClock())
    batches = _Batches()
    engine.attach_kv_events(KVEvents(KVEventSink(block_size, seed=11), batches))
    mirror = TargetMirror(FleetContent("sim")) if whatif else None
    if mirror is not None:
        mirror.whatif.set_pool(blocks)
    decoder = BatchDecoder()
    work = list(work)
    for at in range(0, len(work), together):
        for prompt, max_tokens in work[at:at + together]:
            engine.submit(prompt, max_tokens)
        engine.run_until_idle()
        if mirror is not None:
            for payload in batches.payloads:
                mirror.apply(decoder.decode(payload))
        batches.payloads.clear()
    out = PoolRun(blocks, engine.stats.prompt_tokens, engine.stats.prompt_tokens_cached)
    if mirror is not None:
        out.whatif = mirror.snapshot().whatif
    return out


def compare(scenario: str, blocks: int, scales: Iterable[str], count: int = 300,
            seed: int = 1, together: int = 1) -> tuple[PoolRun, dict[str, PoolRun]]:
    """The base run (with its what-if) and a run at each of ``scales`` times the pool, the
    requests ``together`` at a time."""
    work = requests(scenario, count, seed)
    base = run(blocks, work, whatif=True, together=together)
    return base, {s: run(round(blocks * float(s)), work, together=together) for s in scales}


def table(scenario: str, base: PoolRun, larger: dict[str, PoolRun]) -> list[str]:
    """The comparison as text rows."""
    rows = [f"{scenario}: {base.prompt:,} prompt tokens, base pool {base.blocks} blocks, "
            f"hit ratio {base.ratio:.1%}",
            f"{'pool':>6} {'blocks':>7} {'what-if (1x run)':>17} {'delivered':>10} "
            f"{'difference':>11}"]
    for scale, got in larger.items():
        predicted = base.whatif_ratio(scale)
        rows.append(f"{scale + 'x':>6} {got.blocks:>7} {predicted:>17.1%} {got.ratio:>10.1%} "
                    f"{100 * (predicted - got.ratio):>+10.1f}pt")
    return rows
