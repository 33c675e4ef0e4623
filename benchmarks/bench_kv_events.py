"""KV event ingestion on one core: decode, mirror and classification, against msgspec's decode
alone of the same recorded frames, in one run.

The frames are vLLM 0.33's own (tests/fixtures/kv_events: the fleet and offload recordings,
every message of every replica). Each repetition feeds all of them, in arrival order, through
fresh ``KvSource`` objects (the exporter's whole path after the socket: frame checks, sequence
tracking, typed decode, the content mirror, the computed-token parts, the layout search); the
baseline decodes the same payloads with ``msgspec.msgpack.decode`` and does nothing else. Both
sides run --repeat times, interleaved, and the best run of each is compared (a shared machine
only ever adds time).

Goal: at least 200,000 blocks per second, and at least half the decode-only rate.

Run: python benchmarks/bench_kv_events.py [--repeat 5] [--copies 10] [--profile]
(--profile: one ingest run under cProfile, the functions by their own time; no figures).
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import gc
import json
import pstats
import time
from pathlib import Path

import msgspec

from prefixwatch.exporter.kvevents.source import FleetRegistry, KvSource

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


def blocks_in(messages: list[tuple[str, list[bytes]]]) -> int:
    n = 0
    for _key, f in messages:
        for event in msgspec.msgpack.decode(f[2])[1]:
            n += len(event.get("block_hashes") or ())
    return n


def ingest(messages: list[tuple[str, list[bytes]]], copies: int) -> float:
    start = time.perf_counter()
    for _ in range(copies):
        fleets = FleetRegistry()
        sources: dict[str, KvSource] = {}
        for key, f in messages:
            source = sources.get(key)
            if source is None:
                source = sources[key] = KvSource(key, fleets)
            source.ingest(f)
    return time.perf_counter() - start


def decode_only(messages: list[tuple[str, list[bytes]]], copies: int) -> float:
    decode = msgspec.msgpack.decode
    start = time.perf_counter()
    for _ in range(copies):
        for _key, f in messages:
            decode(f[2])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--copies", type=int, default=10,
                        help="times both recordings are fed per run (default 10)")
    parser.add_argument("--profile", action="store_true",
                        help="profile one ingest run instead (the top 30 functions by own time)")
    args = parser.parse_args()
    messages = frames()
    if args.profile:
        ingest(messages, 1)  # imports and first calls out of the way
        profile = cProfile.Profile()
        profile.runcall(ingest, messages, args.copies)
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    blocks = blocks_in(messages) * args.copies
    best_ingest = best_decode = float("inf")
    gc.collect()
    for _ in range(args.repeat):
        best_decode = min(best_decode, decode_only(messages, args.copies))
        best_ingest = min(best_ingest, ingest(messages, args.copies))
    ingest_rate, decode_rate = blocks / best_ingest, blocks / best_decode
    print(f"messages per run: {len(messages) * args.copies:,}  blocks per run: {blocks:,}")
    print(f"ingest (decode + mirror + classification): {ingest_rate:,.0f} blocks/s")
    print(f"msgspec decode only:                       {decode_rate:,.0f} blocks/s")
    print(f"ratio: {ingest_rate / decode_rate:.2f} of the decode-only rate "
          f"(goal >= 0.50); goal >= 200,000 blocks/s: "
          f"{'met' if ingest_rate >= 200_000 else 'NOT met'}")


if __name__ == "__main__":
    main()
