"""KV event ingestion on one core: decode, mirror and classification, against msgspec's decode
alone of the same recorded frames, in one run.

The frames are vLLM 0.33's own (tests/fixtures/kv_events: the fleet and offload recordings,
every message of every replica). A pass feeds all of them, in arrival order, through fresh
``KvSource`` objects (the exporter's whole path after the socket: frame checks, sequence
tracking, typed decode, the content mirror, the computed-token parts, the layout search); the
baseline decodes the same payloads with ``msgspec.msgpack.decode`` and does nothing else; a
third side, the exporter's typed decode alone (``BatchDecoder``), shows how much of a pass is
decoding. The sides take turns a pass at a time, --repeat passes each, and each side's fastest
pass is compared: a pass lasts milliseconds, so the turns see the same machine, and a shared
machine only ever adds time.

Goal: at least 200,000 blocks per second, and at least half the decode-only rate.

``--stream sglang`` feeds an SGLang stream instead: two simulated SGLang replicas (SGLang's
radix cache at ``--page-size``, default 1, and its positional events: one event a page) serve
the simulator's healthy chat workload, round-robin, in virtual time; their messages are the
frames. At page size 1 a block is a token, so its rate is the tokens per second one core
follows.

Run: python benchmarks/bench_kv_events.py [--repeat 40] [--profile] [--stream sglang
[--page-size N] [--requests N]]
(--profile: 10 ingest passes under cProfile, the functions by their own time; no figures;
--memory: one ingest pass under tracemalloc, the memory the mirrors hold per resident block).
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import gc
import json
import pstats
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from prefixwatch.core.kv.codec import BatchDecoder
from prefixwatch.exporter.kvsubscriber.source import FleetRegistry, KvSource

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "kv_events"


def frames() -> list[tuple[str, list[bytes]]]:
    """(recording/topic, frames) of every message of both recordings, in arrival order."""
    out = []
    for name in ("fleet", "offload"):
        for line in (FIXTURES / name / "kv_events.jsonl").read_text().splitlines():
            row = json.loads(line)
            out.append((f"{name}/{row['topic']}", [row["topic"].encode(),
                                                    row["seq"].to_bytes(8, "big"),
                                                    base64.b64decode(row["payload_b64"])]))
    return out


def sglang_frames(requests: int, page_size: int = 1, replicas: int = 2
                  ) -> list[tuple[str, list[bytes]]]:
    """(replica, frames) of simulated SGLang replicas serving ``requests`` requests of the
    static-system-prompt workload, round-robin, one at a time in virtual time."""
    import random

    from prefixwatch.simulator.driver import tokenize_work
    from prefixwatch.simulator.engine import EngineConfig, VirtualClock
    from prefixwatch.simulator.kvpublisher import KVEvents
    from prefixwatch.simulator.scenarios import SCENARIOS, Corpus
    from prefixwatch.simulator.server import Replica
    from prefixwatch.simulator.sglangengine import SGLangEngine
    from prefixwatch.simulator.sglangevents import SGLangEventSink, encode_sglang_batch

    out: list[tuple[str, list[bytes]]] = []

    class Frames:
        def __init__(self, key: str) -> None:
            self.key, self.seq = key, 0

        def publish(self, events: list) -> None:
            topic = f"kv@{self.key}@{cfg.model}".encode()  # llm-d's form names the model
            out.append((self.key, [topic, self.seq.to_bytes(8, "big"),
                                   encode_sglang_batch(events, ts=float(self.seq))]))
            self.seq += 1

        def restart(self) -> None:
            self.seq = 0

    cfg = EngineConfig(page_size=page_size)
    tokenizer = Replica(cfg, server="sglang")
    engines = []
    for i in range(replicas):
        engine = SGLangEngine(cfg, VirtualClock())
        engine.attach_kv_events(KVEvents(SGLangEventSink(), Frames(f"sglang/{i}")))
        engine.set_answer_vocabulary(tokenizer.tokenizer.answer_ids)
        engines.append(engine)
    make, corpus, rng = SCENARIOS["static-system-prompt"].make, Corpus.build(), random.Random(1)
    for k in range(requests):
        work = make(rng, corpus, None)  # type: ignore[arg-type]
        prompt, _ = tokenize_work(tokenizer, work.body)
        engine = engines[k % replicas]
        engine.submit(prompt, int(work.body.get("max_tokens", 16)))
        engine.run_until_idle()
    return out


def blocks_in(messages: list[tuple[str, list[bytes]]]) -> int:
    n = 0
    for _key, f in messages:
        for event in msgspec.msgpack.decode(f[2])[1]:
            if isinstance(event, dict):  # vLLM 0.33's maps
                n += len(event.get("block_hashes") or ())
            elif event and event[0] in ("BlockStored", "BlockRemoved"):  # SGLang's arrays
                n += len(event[1])
    return n


def ingest(messages: list[tuple[str, list[bytes]]], passes: int = 1) -> float:
    """Seconds to feed every message through fresh sources, ``passes`` times over."""
    start = time.perf_counter()
    for _ in range(passes):
        feed(messages)
    return time.perf_counter() - start


def feed(messages: list[tuple[str, list[bytes]]]) -> dict[str, KvSource]:
    """Every message through fresh sources (one per recording and topic, or replica)."""
    fleets = FleetRegistry()
    sources: dict[str, KvSource] = {}
    for key, f in messages:
        source = sources.get(key)
        if source is None:
            source = sources[key] = KvSource(key, fleets)
        source.ingest(f)
    return sources


def memory(messages: list[tuple[str, list[bytes]]]) -> None:
    """One pass under tracemalloc: what the sources hold afterwards, per resident block."""
    import tracemalloc

    gc.collect()
    tracemalloc.start()
    sources = feed(messages)
    gc.collect()
    held, _peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    resident = sum(sum(s.mirror.snapshot().resident.values()) for s in sources.values()
                   if s.mirror is not None)
    print(f"resident blocks: {resident:,}  held: {held / 1e6:.1f} MB  "
          f"({held / max(resident, 1):,.0f} bytes a resident block)")


def decoding(decode: Callable[[bytes], object]) -> Callable[[list[tuple[str, list[bytes]]]], float]:
    """A side that times ``decode`` of every payload and nothing else: msgspec's untyped
    decode is the baseline, the exporter's ``BatchDecoder`` its own share of a pass."""
    def side(messages: list[tuple[str, list[bytes]]]) -> float:
        start = time.perf_counter()
        for _key, f in messages:
            decode(f[2])
        return time.perf_counter() - start
    return side


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=40,
                        help="passes of each side, taking turns (default 40)")
    parser.add_argument("--profile", action="store_true",
                        help="profile 10 ingest passes instead (the top 30 functions by own "
                             "time)")
    parser.add_argument("--memory", action="store_true",
                        help="measure the mirrors' memory per resident block instead")
    parser.add_argument("--stream", choices=["vllm", "sglang"], default="vllm",
                        help="vLLM 0.33's recordings (default) or a simulated SGLang stream")
    parser.add_argument("--page-size", type=int, default=1,
                        help="the SGLang stream's page size (default 1)")
    parser.add_argument("--requests", type=int, default=200,
                        help="requests in the SGLang stream (default 200)")
    args = parser.parse_args()
    if args.repeat < 1 or args.page_size < 1 or args.requests < 1:
        parser.error("--repeat, --page-size and --requests must be at least 1")
    messages = (frames() if args.stream == "vllm"
                else sglang_frames(args.requests, args.page_size))
    if args.memory:
        memory(messages)
        return
    if args.profile:
        ingest(messages)  # imports and first calls out of the way
        profile = cProfile.Profile()
        profile.runcall(ingest, messages, 10)
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    blocks = blocks_in(messages)
    sides = {"ingest": ingest, "decode": decoding(msgspec.msgpack.decode),
             "typed": decoding(BatchDecoder().decode)}
    best = dict.fromkeys(sides, float("inf"))
    ingest(messages)  # imports and first calls out of the way
    gc.collect()
    for _ in range(args.repeat):
        for name, side in sides.items():
            best[name] = min(best[name], side(messages))
    ingest_rate, decode_rate = blocks / best["ingest"], blocks / best["decode"]
    print(f"stream: {args.stream}" + (f" (page size {args.page_size}, {args.requests} "
                                       f"requests over 2 replicas)"
                                       if args.stream == "sglang" else ""))
    print(f"messages per pass: {len(messages):,}  blocks per pass: {blocks:,}  "
          f"fastest of {args.repeat} passes each")
    print(f"ingest (decode + mirror + classification): {ingest_rate:,.0f} blocks/s "
          f"({best['ingest'] * 1e3:.2f} ms a pass)")
    print(f"msgspec decode only:                       {decode_rate:,.0f} blocks/s "
          f"({best['decode'] * 1e3:.2f} ms a pass)")
    print(f"of the ingest, the typed decode alone:     {best['typed'] * 1e3:.2f} ms a pass "
          f"({best['typed'] / best['decode']:.2f} of the baseline's time)")
    print(f"ratio: {ingest_rate / decode_rate:.2f} of the decode-only rate "
          f"(goal >= 0.50); goal >= 200,000 blocks/s: "
          f"{'met' if ingest_rate >= 200_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
