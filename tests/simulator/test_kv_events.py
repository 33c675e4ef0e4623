"""The simulator's KV event stream against vLLM 0.33's own, recorded beside the requests that
produced it (tests/fixtures/kv_events/: vLLM's scheduler, block pool and ZmqEventPublisher).

The recorded requests are replayed one at a time through the simulator's engine, with the
recording's pool sizes; the simulator's messages come back over a real ZMQ socket (its replay
endpoint, so none is lost to PUB's slow joiner) and are decoded here with plain msgspec. Hashes
are seeded per process, so streams are compared by content: each block is named by its token
ids and its parent's name, rebuilt from ``parent_block_hash`` and ``token_ids`` as a consumer
must.
"""

from __future__ import annotations

import base64
import collections
import json
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from prefixwatch.simulator.engine import Engine, EngineConfig, VirtualClock
from prefixwatch.simulator.kvpublisher import (
    KVEventBatch,
    KVEventPublisher,
    KVEvents,
    KVEventSink,
)

FIXTURES = Path(__file__).parent.parent / "fixtures" / "kv_events"
BLOCK = 16


def recording(name: str) -> list[tuple[str, int, bytes]]:
    """(replica, seq, payload) of every recorded message, in arrival order."""
    out = []
    for line in (FIXTURES / name / "kv_events.jsonl").read_text().splitlines():
        d = json.loads(line)
        out.append((d["topic"].split("@")[1], d["seq"], base64.b64decode(d["payload_b64"])))
    return out


def requests_of(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in
            (FIXTURES / name / "requests.jsonl").read_text().splitlines()]


class Canon:
    """Names blocks by content across streams: (parent's name, token ids) -> a small int."""

    def __init__(self) -> None:
        self.names: dict[tuple[int | None, tuple[int, ...]], int] = {}
        self.depth: dict[int, int] = {}

    def message(self, by_hash: dict[int, int], payload: bytes) -> list[tuple]:
        """One message as content: ("stored", medium, first position, parent, names) and
        ("removed", medium, name) events. A process hashes a content alike on every medium;
        a hash the stream never stored is an error (KeyError)."""
        ts, events, rank = msgspec.msgpack.decode(payload)
        assert isinstance(ts, float) and rank == 0
        out: list[tuple] = []
        for e in events:
            if e["type"] == "BlockStored":
                assert e["block_size"] == BLOCK
                assert len(e["token_ids"]) == BLOCK * len(e["block_hashes"])
                parent = e["parent_block_hash"]
                prev = None if parent is None else by_hash[parent]
                first = 0 if prev is None else self.depth[prev] + 1
                start, names = prev, []
                for k, h in enumerate(e["block_hashes"]):
                    key = (prev, tuple(e["token_ids"][k * BLOCK:(k + 1) * BLOCK]))
                    name = self.names.setdefault(key, len(self.names))
                    self.depth[name] = 0 if prev is None else self.depth[prev] + 1
                    by_hash[h] = name
                    names.append(name)
                    prev = name
                out.append(("stored", e["medium"], first, start, tuple(names)))
            elif e["type"] == "BlockRemoved":
                for h in e["block_hashes"]:
                    out.append(("removed", e["medium"], by_hash[h]))
            else:
                out.append((e["type"],))
        return out


def totals(messages: list[list[tuple]]) -> dict[tuple[str, str], int]:
    """Blocks stored and removed, per medium."""
    c: collections.Counter[tuple[str, str]] = collections.Counter()
    for m in messages:
        for e in m:
            if e[0] == "stored":
                c[(e[1], "stored")] += len(e[4])
            elif e[0] == "removed":
                c[(e[1], "removed")] += 1
    return dict(c)


def replay_endpoint_messages(endpoint: str, expected: int) -> list[tuple[int, bytes]]:
    """Everything a publisher buffered, from sequence 0, through vLLM's replay protocol."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        sock.send_multipart([b"", (0).to_bytes(8, "big")])
        out = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sock.poll(1000):
            _, seq, payload = sock.recv_multipart()
            if int.from_bytes(seq, "big", signed=True) == -1:
                break
            out.append((int.from_bytes(seq, "big"), payload))
        assert len(out) == expected, f"replayed {len(out)} of {expected} messages"
        return out
    finally:
        sock.close()


def run_recorded_requests(name: str, num_blocks: int, offload_blocks: int = 0
                          ) -> tuple[dict[str, list[tuple[int, bytes]]],
                                     dict[str, list[tuple[int, int, str]]], list[int]]:
    """Replay a recording's requests through one engine per replica, each publishing on its
    own loopback port. Returns each replica's (seq, payload) messages, which request produced
    each message ((request i, message index, phase)), and the cached tokens per request."""
    engines: dict[str, Engine] = {}
    publishers: dict[str, KVEventPublisher] = {}
    owner: dict[str, list[tuple[int, int, str]]] = collections.defaultdict(list)
    cached = []
    try:
        for req in requests_of(name):
            replica = req["replica"]
            if replica not in engines:
                engine = Engine(EngineConfig(num_blocks=num_blocks, max_model_len=8192,
                                             offload_blocks=offload_blocks,
                                             time_per_output_token=0.001), clock=VirtualClock())
                pub = KVEventPublisher("tcp://127.0.0.1:0", topic=f"kv@{replica}",
                                       replay_endpoint="tcp://127.0.0.1:0", bind=True)
                pub.start()
                engine.attach_kv_events(KVEvents(KVEventSink(BLOCK), pub))
                engines[replica], publishers[replica] = engine, pub
            engine, pub = engines[replica], publishers[replica]
            n0 = pub.published
            sim = engine.submit(req["prompt_token_ids"], 1)
            engine.run_until_idle(step=0.01)
            cached.append(sim.cached_tokens)
            for k in range(n0, pub.published):
                owner[replica].append((req["i"], k, req["phase"]))
        out = {}
        for replica, pub in publishers.items():
            _drain(pub, len(owner[replica]))
            assert pub.replay_endpoint is not None
            out[replica] = replay_endpoint_messages(pub.replay_endpoint, len(owner[replica]))
        return out, owner, cached
    finally:
        for pub in publishers.values():
            pub.stop()


def _drain(pub: KVEventPublisher, expected: int) -> None:
    deadline = time.monotonic() + 10
    while pub.sent + pub.dropped < expected and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pub.sent == expected and pub.dropped == 0


# -- the wire format ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fleet", "offload"])
def test_the_simulators_structs_encode_vllms_recorded_payloads_byte_for_byte(name: str) -> None:
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    payloads = [p for _, _, p in recording(name)]
    assert payloads
    for payload in payloads:
        assert msgspec.msgpack.encode(decoder.decode(payload)) == payload


def test_a_published_message_has_vllms_frames_and_field_set() -> None:
    """Three frames (topic, 8-byte big-endian seq, payload); the same keys as vLLM's GPU
    BlockStored and BlockRemoved, defaults omitted."""
    engine = Engine(EngineConfig(num_blocks=4, max_model_len=256), clock=VirtualClock())
    pub = KVEventPublisher("tcp://127.0.0.1:0", topic="kv-events", bind=True)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        sub.connect(pub.endpoint)
        pub.start()
        engine.attach_kv_events(KVEvents(KVEventSink(BLOCK), pub))
        frames: list[list[bytes]] = []
        deadline = time.monotonic() + 10
        prompt = list(range(100, 133))  # 2 full blocks and a tail
        other = list(range(500, 533))
        while not frames and time.monotonic() < deadline:  # until the subscription is up
            engine.submit(prompt, 1)
            engine.run_until_idle()
            if sub.poll(200):
                frames.append(sub.recv_multipart())
        engine.submit(other, 1)  # 3 blocks of a 3-block pool: evicts the cached ones
        engine.run_until_idle()
        while sub.poll(500):
            frames.append(sub.recv_multipart())
    finally:
        sub.close()
        pub.stop()
    assert frames and all(len(f) == 3 and f[0] == b"kv-events" and len(f[1]) == 8
                          for f in frames)
    seqs = [int.from_bytes(f[1], "big") for f in frames]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
    recorded = {}
    for _, _, payload in recording("fleet"):
        for e in msgspec.msgpack.decode(payload)[1]:
            recorded.setdefault(e["type"], list(e))
    ours = {}
    for f in frames:
        for e in msgspec.msgpack.decode(f[2])[1]:
            ours.setdefault(e["type"], list(e))
    assert ours == recorded  # same keys, same order, for both event types


# -- exactness against vLLM ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fleet() -> tuple[dict[str, list[list[tuple]]], dict[str, list[list[tuple]]],
                     dict[str, list[tuple[int, int, str]]], list[int]]:
    ours, owner, cached = run_recorded_requests("fleet", num_blocks=700)
    canon = Canon()
    theirs: dict[str, list[list[tuple]]] = collections.defaultdict(list)
    by_hash_rec: dict[str, dict[int, int]] = collections.defaultdict(dict)
    for replica, _, payload in recording("fleet"):
        theirs[replica].append(canon.message(by_hash_rec[replica], payload))
    mine: dict[str, list[list[tuple]]] = {}
    for replica, messages in ours.items():
        assert [seq for seq, _ in messages] == list(range(len(messages)))
        by_hash: dict[int, int] = {}
        mine[replica] = [canon.message(by_hash, payload) for _, payload in messages]
    return dict(theirs), mine, owner, cached


def test_fleet_cached_tokens_equal_vllms_request_by_request(fleet) -> None:
    _, _, _, cached = fleet
    assert cached == [r["cached_tokens"] for r in requests_of("fleet")]


def test_fleet_stores_exactly_the_blocks_vllm_stores_in_the_phases_without_eviction(
        fleet) -> None:
    """Request by request: the same blocks (token ids), at the same positions, chained to the
    same parents, one BlockStored per request, where no block was evicted yet."""
    theirs, mine, owner, _ = fleet
    checked: collections.Counter[str] = collections.Counter()
    for replica in ("replica-0", "replica-1"):
        for (i, k, phase), ours in zip(owner[replica], mine[replica], strict=True):
            rec = theirs[replica][k]
            if any(e[0] == "removed" for e in rec):
                continue
            assert ours == rec, f"request {i} ({phase}) on {replica}"
            assert [e[0] for e in ours] == ["stored"]
            checked[phase] += 1
    # Every static request, and the timestamp requests until the 700-block pools are full.
    assert checked == {"static": 12, "timestamp-at-top": 6}


def test_fleet_evictions_match_vllms_to_the_block(fleet) -> None:
    """With the recording's pool (700 blocks per replica) the totals match (replica 0 stored
    2,400 and removed 1,702; replica 1 1,266 and 568), and so does every message: which cached
    blocks each allocation evicted, in vLLM's order."""
    theirs, mine, _, _ = fleet
    assert totals(mine["replica-0"]) == totals(theirs["replica-0"]) == {
        ("GPU", "stored"): 2400, ("GPU", "removed"): 1702}
    assert totals(mine["replica-1"]) == totals(theirs["replica-1"]) == {
        ("GPU", "stored"): 1266, ("GPU", "removed"): 568}
    for replica in theirs:
        assert len(mine[replica]) == len(theirs[replica])
        for k, (ours, rec) in enumerate(zip(mine[replica], theirs[replica], strict=True)):
            assert ours == rec, f"{replica} message {k}"


def test_fleet_phases_tell_routing_eviction_and_layout_apart(fleet) -> None:
    """What the exporter's classification reads from the stream: replica 1's first static
    request stores the system prompt that replica 0 holds (routing); replica 0's first request
    after the pressure stores again the 150 blocks it had stored and removed (eviction); a
    timestamp request diverges inside the first block, so it stores ~150 new blocks from 0."""
    _, mine, owner, _ = fleet

    def first_store(replica: str, phase: str) -> tuple:
        k = next(k for _, k, p in owner[replica] if p == phase)
        return next(e for e in mine[replica][k] if e[0] == "stored")

    r0 = first_store("replica-0", "static")
    r1 = first_store("replica-1", "static")
    assert r0[2] == r1[2] == 0 and r1[4][:150] == r0[4][:150]
    before = next(k for _, k, p in owner["replica-0"] if p == "static-after-pressure")
    seen = {n for m in mine["replica-0"][:before] for e in m if e[0] == "stored" for n in e[4]}
    gone = {e[2] for m in mine["replica-0"][:before] for e in m if e[0] == "removed"}
    again = first_store("replica-0", "static-after-pressure")
    assert again[2] == 0 and set(again[4][:150]) <= seen & gone
    ts = first_store("replica-0", "timestamp-at-top")
    assert ts[2] == 0 and len(ts[4]) >= 150 and ts[4][0] != r0[4][0]


# -- the host tier ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def offload() -> tuple[list[list[tuple]], list[list[tuple]], list[tuple[int, int, str]],
                       list[int]]:
    ours, owner, cached = run_recorded_requests("offload", num_blocks=400,
                                                offload_blocks=8192)
    canon = Canon()
    by_hash_rec: dict = {}
    theirs = [canon.message(by_hash_rec, p) for _, _, p in recording("offload")]
    by_hash: dict = {}
    mine = [canon.message(by_hash, p) for _, p in ours["replica-0"]]
    return theirs, mine, owner["replica-0"], cached


def test_offload_cached_tokens_equal_vllms_request_by_request(offload) -> None:
    _, _, _, cached = offload
    assert cached == [r["cached_tokens"] for r in requests_of("offload")]


def test_offload_totals_per_medium_equal_vllms(offload) -> None:
    theirs, mine, _, _ = offload
    assert totals(mine) == totals(theirs) == {
        ("GPU", "stored"): 3366, ("CPU", "stored"): 3216, ("GPU", "removed"): 2968}


def test_offload_stream_equals_vllms_until_the_host_tier_serves(offload) -> None:
    """Message by message (GPU stores, then the connector's CPU stores a step later, one event
    per block chained to its parent; under pressure the evictions of blocks that the copies
    pinned, first block first) up to the request the host tier serves."""
    theirs, mine, owner, _ = offload
    served = next(k for i, k, phase in owner if phase == "static-after-pressure")
    assert served == 60
    assert mine[:served] == theirs[:served]
    cpu = [e for m in mine[:served] for e in m if e[1:2] == ("CPU",)]
    assert cpu and all(e[0] == "stored" and len(e[4]) == 1 for e in cpu)


def test_offload_the_host_hit_step_and_everything_after_it_equal_vllms(offload) -> None:
    """The request the host tier serves: vLLM allocates the loaded blocks in one step (149
    evictions), then stores the 150 loaded blocks, evicts 4 more and stores the 3 it computes;
    the simulator does it in one step: the same evictions in the same order, the same 153
    blocks stored (one event). Every message after it is vLLM's, one index later."""
    theirs, mine, owner, _ = offload
    served = next(k for i, k, phase in owner if phase == "static-after-pressure")

    def removed(messages: list[list[tuple]]) -> list[int]:
        return [e[2] for m in messages for e in m if e[0] == "removed"]

    def stored(messages: list[list[tuple]]) -> list[int]:
        return [n for m in messages for e in m if e[0] == "stored" for n in e[4]]

    assert [len(removed([m])) for m in theirs[served:served + 2]] == [149, 4]
    assert removed(mine[served:served + 1]) == removed(theirs[served:served + 2])
    assert stored(mine[served:served + 1]) == stored(theirs[served:served + 2])
    assert len(stored(mine[served:served + 1])) == 153
    assert mine[served + 1:] == theirs[served + 2:]
    assert len(mine) == len(theirs) - 1 == 88


def test_offload_a_host_load_stores_the_system_prompt_on_the_device_again(offload) -> None:
    """The request served from the host tier: its 150 system-prompt blocks are stored on the
    GPU a second time (not computed: loaded), in both streams; vLLM publishes the loaded blocks
    a step before the computed ones, the simulator in the same step (a stated difference)."""
    theirs, mine, owner, _ = offload

    def gpu_stores_of_prompt(messages: list[list[tuple]], upto: int) -> collections.Counter:
        c: collections.Counter[int] = collections.Counter()
        for m in messages[:upto]:
            for e in m:
                if e[0] == "stored" and e[1] == "GPU":
                    c.update(name for name in e[4])
        return c

    system = next(e for e in mine[0] if e[0] == "stored")[4][:150]
    served = next(k for i, k, phase in owner if phase == "static-after-pressure")
    ours = gpu_stores_of_prompt(mine, served + 1)
    rec = gpu_stores_of_prompt(theirs, served + 2)
    assert [ours[n] for n in system] == [rec[n] for n in system] == [2] * 150


class _Batches:
    """Where a replica's batches go, kept in order (``KVEvents`` takes any publisher)."""

    def __init__(self) -> None:
        self.batches: list[list] = []

    def publish(self, events: list) -> None:
        self.batches.append(events)

    def restart(self) -> None:
        self.batches.clear()


def test_answer_blocks_are_stored_as_vllm_caches_them() -> None:
    """vLLM caches every full block within a request's first prompt + generated - 1 tokens
    (the last sampled token is never fed back), answers' blocks included, one store per
    step a block fills, each chained to the block before it (block_pool.cache_full_blocks)."""
    engine = Engine(EngineConfig(block_size=BLOCK, num_blocks=64, time_per_output_token=0.01),
                    clock=VirtualClock())
    out = _Batches()
    sink = KVEventSink(BLOCK, seed=7)
    engine.attach_kv_events(KVEvents(sink, out))
    prompt = list(range(100, 140))  # 2 full blocks and 8 tokens
    req = engine.submit(prompt, 40)
    engine.run_until_idle(step=0.005)
    stored = [e for batch in out.batches for e in batch if type(e).__name__ == "BlockStored"]
    tokens = [t for e in stored for t in e.token_ids]
    full = (len(prompt) + len(req.output) - 1) // BLOCK
    assert len(req.output) == 40 and full == 4
    assert tokens == (prompt + req.output)[:full * BLOCK]
    # The prompt's two blocks in one store at its prefill, then one store per answer block.
    assert [len(e.block_hashes) for e in stored] == [2, 1, 1]
    for before, after in zip(stored, stored[1:], strict=False):
        assert after.parent_block_hash == before.block_hashes[-1]
