"""Bad KV event input: each case counted with a reason, never a traceback, memory bounded, the
other target unaffected. Real ZMQ sockets on 127.0.0.1, bounded in time."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import msgspec
import pytest
import yaml
import zmq

from prefixwatch.core.kv.codec import BatchDecoder
from prefixwatch.exporter.config import ConfigFlags, build_config
from prefixwatch.exporter.service import Exporter
from tests.conftest import PageServer
from tests.exporter.kvstreams import Publisher, page_of, value, wait_for

enc = msgspec.msgpack.Encoder()


def stored(hashes, parent=None, tokens=None, medium="GPU"):
    tokens = tokens if tokens is not None else [h % 30000 for h in hashes for _ in range(16)]
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": tokens, "block_size": 16, "medium": medium}


def batch(*events) -> bytes:
    return enc.encode([time.time(), list(events), 0])


def msg(seq: int, payload: bytes, topic: bytes = b"kv-events") -> list[bytes]:
    return [topic, seq.to_bytes(8, "big"), payload]


class Pair:
    """An exporter with two targets: ``bad`` gets the hostile stream, ``good`` a sane one."""

    def __init__(self, tmp_path, bad_endpoint: str | None = None, replay: str | None = None,
                 ) -> None:
        self.ctx = zmq.Context()
        self.pages = [PageServer(), PageServer()]
        for p in self.pages:
            p.serve(page_of("fleet", 0))
        self.good_pub = Publisher(self.ctx)
        self.bad_pub = None if bad_endpoint else Publisher(self.ctx)
        bad = {"url": self.pages[0].url, "name": "bad",
               "kv_events": bad_endpoint or self.bad_pub.endpoint}
        if replay:
            bad["kv_events_replay"] = replay
        cfg = tmp_path / "exporter.yaml"
        cfg.write_text(yaml.safe_dump({"targets": [
            bad, {"url": self.pages[1].url, "name": "good",
                  "kv_events": self.good_pub.endpoint}]}))
        self.exp = Exporter(build_config(ConfigFlags(config_file=str(cfg), interval=0.2,
                                                     listen_address="127.0.0.1:0"), environ={}))
        self.exp.start()
        wait_for(lambda: self.v("prefixwatch_kv_events_up", target="good") == 1.0,
                 what="good subscribed")
        if bad_endpoint is None:
            wait_for(lambda: self.v("prefixwatch_kv_events_up", target="bad") == 1.0,
                     what="bad subscribed")

    def v(self, name: str, **labels: str) -> float | None:
        return value(self.exp.registry, name, **labels)

    def err(self, reason: str, target: str = "bad") -> float | None:
        return self.v("prefixwatch_kv_events_errors_total", target=target, reason=reason)

    def good_still_works(self) -> None:
        """The good target's stream and polls go on."""
        src = self.exp.kv.sources["good"]
        before = src.messages
        self.good_pub.send(msg(before, batch(stored([10**6 + before]))))
        wait_for(lambda: src.messages == before + 1, what="the good target's message")
        mon = next(m for m in self.exp.monitors if m.name == "good")
        polled = mon.view.last_polled
        wait_for(lambda: mon.view.last_polled != polled and mon.view.up,
                 what="the good target polled")

    def close(self) -> None:
        self.exp.stop()
        self.good_pub.close()
        if self.bad_pub is not None:
            self.bad_pub.close()
        for p in self.pages:
            p.close()
        self.ctx.destroy(linger=0)


@pytest.fixture
def pair(tmp_path):
    p = Pair(tmp_path)
    yield p
    p.close()


def _sent(pair: Pair, frames: list[bytes]) -> None:
    src = pair.exp.kv.sources["bad"]
    before = sum(src.view().errors.values()) + src.view().messages
    pair.bad_pub.send(frames)
    wait_for(lambda: sum(src.view().errors.values()) + src.view().messages > before,
             what="handled")


def test_malformed_payload_unknown_type_and_wrong_frames_are_counted(pair) -> None:
    _sent(pair, msg(0, b"\xc1 not msgpack"))
    assert pair.err("malformed_payload") == 1
    _sent(pair, msg(1, enc.encode({"not": "a batch"})))
    assert pair.err("malformed_payload") == 2
    # An unknown tag beside a known event: the known one is used.
    _sent(pair, msg(2, batch({"type": "BlockTeleported", "block_hashes": [1]}, stored([7]))))
    assert pair.err("unknown_event_type") == 1
    assert pair.v("prefixwatch_kv_blocks_total", target="bad", medium="GPU",
                  op="stored") == 1
    # A known tag whose fields do not fit.
    _sent(pair, msg(3, batch({"type": "BlockStored", "block_hashes": "nope"})))
    assert pair.err("malformed_payload") == 3
    pair.bad_pub.send([b"kv-events"])
    wait_for(lambda: pair.err("wrong_frame_count") == 1, what="one-frame message counted")
    pair.bad_pub.send([b"kv-events", b"\x00\x01", batch()])
    wait_for(lambda: pair.err("bad_sequence") == 1, what="short sequence counted")
    assert pair.v("prefixwatch_kv_events_lost_total", target="bad") == 0
    pair.good_still_works()
    assert pair.err("malformed_payload", "good") == 0


def test_positional_events_and_bytes_hashes_decode_as_maps_do() -> None:
    dec = BatchDecoder()
    positional = enc.encode([1.0, [["BlockStored", [b"\x01" * 32], None, list(range(16)), 16,
                                    None, "GPU", None, None, "extra field"],
                                   ["BlockRemoved", [b"\x01" * 32], "GPU"],
                                   ["AllBlocksCleared"]], 0])
    got = dec.decode(positional)
    assert [type(e).__name__ for e in got.events] == ["_ArrayStored", "_ArrayRemoved",
                                                       "_ArrayCleared"]
    assert got.events[0].block_hashes == [b"\x01" * 32] and got.events[0].medium == "GPU"
    mixed = enc.encode([1.0, [["BlockStored", [5], None, [], 16, None], ["Mystery", 1]], None])
    got = dec.decode(mixed)
    assert len(got.events) == 1 and got.dropped == {"unknown_event_type": 1}


def test_a_sequence_gap_without_replay_is_lost(pair) -> None:
    src = pair.exp.kv.sources["bad"]
    pair.bad_pub.send(msg(0, batch(stored([1]))))
    pair.bad_pub.send(msg(5, batch(stored([2], parent=1))))
    wait_for(lambda: src.messages == 2, what="both messages")
    assert pair.v("prefixwatch_kv_events_lost_total", target="bad") == 4


class Router:
    """A replay endpoint as vLLM's: ROUTER, 8-byte start, (seq, payload)..., then -1."""

    def __init__(self, ctx: zmq.Context, buffer: list[tuple[int, bytes]], answer: bool = True
                 ) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.endpoint = f"tcp://127.0.0.1:{self.sock.bind_to_random_port('tcp://127.0.0.1')}"
        self.buffer, self.answer = buffer, answer
        self.requests: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            if not self.sock.poll(50):
                continue
            client, _, start = self.sock.recv_multipart()
            self.requests.append(int.from_bytes(start, "big"))
            if not self.answer:
                continue
            for seq, payload in self.buffer:
                if seq >= self.requests[-1]:
                    self.sock.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            self.sock.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True), b""])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(1)
        self.sock.close(linger=0)


def test_a_gap_is_filled_from_the_replay_endpoint(tmp_path) -> None:
    ctx = zmq.Context()
    payloads = [batch(stored([100 + i], parent=(99 + i) if i else None)) for i in range(6)]
    router = Router(ctx, list(enumerate(payloads)))
    pub = Publisher(ctx)
    p = Pair(tmp_path, bad_endpoint=pub.endpoint, replay=router.endpoint)
    try:
        wait_for(lambda: p.v("prefixwatch_kv_events_up", target="bad") == 1.0, what="up")
        src = p.exp.kv.sources["bad"]
        pub.send(msg(0, payloads[0]))
        wait_for(lambda: src.messages == 1, what="first")
        pub.send(msg(5, payloads[5]))  # 1..4 never arrive live
        wait_for(lambda: src.messages == 6, what="the gap replayed")
        assert router.requests == [1]
        assert p.v("prefixwatch_kv_events_lost_total", target="bad") == 0
        assert p.v("prefixwatch_kv_blocks_total", target="bad", medium="GPU",
                   op="stored") == 6
        assert p.err("unknown_parent") == 0  # the chain is whole again
    finally:
        p.close()
        router.close()
        pub.close()
        ctx.destroy(linger=0)


def test_a_replay_endpoint_that_never_answers_costs_one_deadline(tmp_path) -> None:
    ctx = zmq.Context()
    router = Router(ctx, [], answer=False)
    pub = Publisher(ctx)
    p = Pair(tmp_path, bad_endpoint=pub.endpoint, replay=router.endpoint)
    try:
        wait_for(lambda: p.v("prefixwatch_kv_events_up", target="bad") == 1.0, what="up")
        src = p.exp.kv.sources["bad"]
        pub.send(msg(0, batch(stored([1]))))
        wait_for(lambda: src.messages == 1, what="first")
        started = time.monotonic()
        pub.send(msg(3, batch(stored([2]))))
        p.good_still_works()  # while the bad target waits for its replay
        wait_for(lambda: src.messages == 2, timeout=5, what="given up on the replay")
        assert time.monotonic() - started < 4
        assert p.err("replay_timeout") == 1
        assert p.v("prefixwatch_kv_events_lost_total", target="bad") == 2
    finally:
        p.close()
        router.close()
        pub.close()
        ctx.destroy(linger=0)


def test_a_stalled_publisher_is_down_and_the_other_target_is_not(tmp_path) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(srv.accept()[0]), daemon=True).start()
    p = Pair(tmp_path, bad_endpoint=f"tcp://127.0.0.1:{srv.getsockname()[1]}")
    try:
        wait_for(lambda: bool(held), what="the stalled peer accepted")
        assert p.v("prefixwatch_kv_events_up", target="bad") == 0.0
        p.good_still_works()
        assert p.v("prefixwatch_kv_events_up", target="good") == 1.0
    finally:
        p.close()
        for s in held:
            s.close()
        srv.close()


def test_a_flooding_publisher_is_bounded_and_the_other_target_goes_on(pair) -> None:
    src = pair.exp.kv.sources["bad"]
    src.max_resident = 5_000  # the cap, small enough to reach in a test
    stop = threading.Event()

    def flood() -> None:
        seq = 0
        while not stop.is_set() and seq < 200_000:
            hashes = range(seq * 8, seq * 8 + 8)
            with contextlib.suppress(zmq.Again):
                pair.bad_pub.sock.send_multipart(msg(seq, batch(stored(hashes))), zmq.NOBLOCK)
            seq += 1

    thread = threading.Thread(target=flood, daemon=True)
    thread.start()
    try:
        wait_for(lambda: (pair.err("mirror_full") or 0) > 0, timeout=20, what="the cap reached")
        pair.good_still_works()
    finally:
        stop.set()
        thread.join(5)
    snap = src.view().snapshot
    assert snap is not None and sum(snap.resident.values()) <= 5_000
    lost = pair.v("prefixwatch_kv_events_lost_total", target="bad")
    stored_ = pair.v("prefixwatch_kv_blocks_total", target="bad", medium="GPU", op="stored")
    assert lost is not None and stored_ is not None and stored_ > 5_000


def test_sigterm_ends_the_exporter_with_a_subscription_within_2s(tmp_path) -> None:
    page = PageServer()
    page.serve(page_of("fleet", 0))
    ctx = zmq.Context()
    pub = Publisher(ctx)
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefixwatch.cli", "exporter", "--target", page.url,
         "--kv-events", pub.endpoint, "--listen-address", "127.0.0.1:0", "--interval", "0.2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        time.sleep(2.0)
        for i in range(20):
            pub.send(msg(i, batch(stored([i]))))
        time.sleep(0.3)
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=5)
        assert time.monotonic() - started < 2.0
        out = proc.stdout.read().decode() if proc.stdout else ""
        assert "Traceback" not in out, out
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close()
        ctx.destroy(linger=0)
        page.close()


_CHILD = """
import sys, time, zmq
ctx = zmq.Context()
pub = ctx.socket(zmq.PUB)
pub.setsockopt(zmq.HEARTBEAT_IVL, 100)  # pings the subscriber too: both sides are libzmq
port = pub.bind_to_random_port("tcp://127.0.0.1")
print(port, flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_publisher_that_stops_answering_is_dropped_by_its_heartbeat(tmp_path, monkeypatch
                                                                       ) -> None:
    """A publisher process stopped (SIGSTOP) after the connection: no more pongs, the
    subscription's heartbeat times out, the stream is down and counted, the other goes on."""
    from prefixwatch.exporter.kvsubscriber import subscriber

    monkeypatch.setattr(subscriber, "HEARTBEAT_MS", 200)
    child = subprocess.Popen([sys.executable, "-c", _CHILD], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        p = Pair(tmp_path, bad_endpoint=f"tcp://127.0.0.1:{port}")
        try:
            wait_for(lambda: p.v("prefixwatch_kv_events_up", target="bad") == 1.0,
                     what="connected")
            child.send_signal(signal.SIGSTOP)
            wait_for(lambda: p.v("prefixwatch_kv_events_up", target="bad") == 0.0,
                     timeout=15, what="the heartbeat timed out")
            assert p.err("disconnected") >= 1
            p.good_still_works()
        finally:
            p.close()
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait(5)


def test_a_restarted_engine_is_reconnected_and_its_mirror_starts_again(tmp_path) -> None:
    ctx = zmq.Context()
    first = Publisher(ctx)
    endpoint = first.endpoint
    p = Pair(tmp_path, bad_endpoint=endpoint)
    try:
        first.wait_subscribed()
        src = p.exp.kv.sources["bad"]
        for seq in range(3):
            first.send(msg(seq, batch(stored([seq]))))
        wait_for(lambda: src.messages == 3, what="the first engine's messages")
        # the mirror exists once the target's first poll names the model (until then the
        # batches are held, and a restart drops them): wait for it, however loaded the machine
        wait_for(lambda: p.v("prefixwatch_kv_resident_blocks", target="bad", medium="GPU") == 3,
                 what="the first engine's blocks in the mirror")
        first.close()
        wait_for(lambda: p.v("prefixwatch_kv_events_up", target="bad") == 0.0,
                 what="down with the engine")
        second = ctx.socket(zmq.XPUB)
        second.setsockopt(zmq.LINGER, 0)
        second.bind(endpoint)  # the restarted engine, same endpoint
        try:
            if not second.poll(20_000):
                raise AssertionError("not reconnected")
            second.recv()
            second.send_multipart(msg(0, batch(stored([50]))))
            wait_for(lambda: p.err("sequence_restart") == 1, what="the restart seen")
            assert p.v("prefixwatch_kv_events_up", target="bad") == 1.0
            assert p.v("prefixwatch_kv_resident_blocks", target="bad", medium="GPU") == 1
            assert p.err("disconnected") >= 1
        finally:
            second.close(linger=0)
    finally:
        p.close()
        ctx.destroy(linger=0)


def test_a_restart_drops_the_batches_held_before_the_model_was_known() -> None:
    """An engine restarts while its first poll is under way: what the stopped engine stored
    (held until the model is known) is gone with it, and the restart counts once the mirror
    holds only the new engine's blocks."""
    from prefixwatch.exporter.kvsubscriber.source import FleetRegistry, KvSource

    model: list[str | None] = [None]
    source = KvSource("bad", FleetRegistry(), model_hint=lambda: model[0])
    for seq in range(3):
        source.ingest(msg(seq, batch(stored([seq]))))
    assert source.mirror is None  # held: the model is not known yet
    source.ingest(msg(0, batch(stored([50]))))  # the restarted engine
    assert source.view().errors["sequence_restart"] == 1
    model[0] = "m"
    source.ingest(msg(1, batch(stored([51], parent=50))))
    assert source.view().snapshot.resident == {"GPU": 2}


def test_held_batches_reach_the_mirror_when_the_model_is_known_with_no_next_message(
        monkeypatch) -> None:
    """An engine sends its first batches before the target's first poll has named the model,
    then goes quiet: the reading thread's idle tick files them once the model is known (or
    once they have waited their time), not at a next message that may not come."""
    from prefixwatch.exporter.kvsubscriber import source as source_module
    from prefixwatch.exporter.kvsubscriber.source import FleetRegistry, KvSource

    model: list[str | None] = [None]
    source = KvSource("quiet", FleetRegistry(), model_hint=lambda: model[0])
    for seq in range(3):
        source.ingest(msg(seq, batch(stored([seq]))))
    source.idle()
    assert source.mirror is None  # still held: the model is not known yet
    model[0] = "m"
    source.idle()
    assert source.view().snapshot.resident == {"GPU": 3}
    assert source.view().snapshot.model == "m"
    # ...and with no model ever known, they go in under no model once their time is up
    late = KvSource("nameless", FleetRegistry())
    late.ingest(msg(0, batch(stored([7]))))
    late.idle()
    assert late.mirror is None
    monkeypatch.setattr(source_module, "HOLD_SECONDS", 0.0)
    late.idle()
    assert late.view().snapshot.resident == {"GPU": 1}
