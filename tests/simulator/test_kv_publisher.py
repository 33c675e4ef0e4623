"""`prefixwatch simulate --kv-events-port`: each replica's ZMQ publisher, as `vllm serve` runs it.

Real sockets on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import msgspec
import pytest
import requests
import zmq

from prefixwatch.core.errors import ConfigError
from prefixwatch.simulator.cli import build_simulation, simulation_args
from prefixwatch.simulator.kvpublisher import KVEventSink, offset_endpoint
from tests.conftest import free_port


def consecutive_free_ports(n: int) -> int:
    """A port P with P..P+n-1 free right now (retrying a few bases)."""
    for _ in range(50):
        base = free_port()
        if base + n >= 65536:
            continue
        socks = []
        try:
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no consecutive free ports")


def subscriber(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(endpoint)
    return sock


def post_until_event(url: str, sub: zmq.Socket, prompt: list[int] | None = None
                     ) -> tuple[list[list[bytes]], list[int]]:
    """Send a prompt until the subscriber hears a message (PUB drops what it sends before the
    subscription arrives), a new prompt each time unless ``prompt`` is given (a cached one
    stores nothing); then collect what follows for a moment. Returns the frames and the
    prompt of the first message."""
    frames: list[list[bytes]] = []
    sent: list[list[int]] = []
    deadline = time.monotonic() + 15
    while not frames and time.monotonic() < deadline:
        sent.append(prompt or [10_000 + 100 * len(sent) + j for j in range(40)])
        r = requests.post(url + "/v1/completions", json={"prompt": sent[-1], "max_tokens": 1},
                          timeout=10)
        assert r.status_code == 200
        if sub.poll(300):
            frames.append(sub.recv_multipart())
    while sub.poll(300):
        frames.append(sub.recv_multipart())
    assert frames, "no KV event message within 15 s"
    first = stored_token_ids(frames[:1])[0]
    return frames, next(p for p in sent if p[:len(first)] == first)


def stored_token_ids(frames: list[list[bytes]]) -> list[list[int]]:
    return [e["token_ids"] for f in frames for e in msgspec.msgpack.decode(f[2])[1]
            if e["type"] == "BlockStored"]


def test_replica_i_binds_port_n_plus_i_and_publishes_its_own_pool() -> None:
    base = consecutive_free_ports(4)
    http = base + 2
    sim = build_simulation(simulation_args(replicas=2, rate=0, port=http, kv_events_port=base,
                                           kv_events_topic="kv-events"))
    subs = []
    try:
        sim.start()
        assert sim.kv_events_endpoints == [f"tcp://127.0.0.1:{base}",
                                           f"tcp://127.0.0.1:{base + 1}"]
        subs = [subscriber(e) for e in sim.kv_events_endpoints]
        frames, prompt = post_until_event(f"http://127.0.0.1:{http + 1}", subs[1])
        assert all(f[0] == b"kv-events" for f in frames)
        assert stored_token_ids(frames)[0] == prompt[:32]  # 2 full blocks of 40 tokens
        assert not subs[0].poll(200)  # replica 0 served nothing: it published nothing
    finally:
        for s in subs:
            s.close()
        sim.stop()
    # Stopped means closed: the ports can be bound again at once.
    again = build_simulation(simulation_args(replicas=2, rate=0, port=http, kv_events_port=base))
    again.stop()


def test_the_replay_endpoint_resends_from_a_sequence_number() -> None:
    base = consecutive_free_ports(3)
    sim = build_simulation(simulation_args(rate=0, port=base, kv_events_port=base + 1,
                                           kv_events_replay_port=base + 2))
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sim.start()
        for k in range(3):  # three requests, three messages (sequence 0, 1, 2)
            requests.post(f"http://127.0.0.1:{base}/v1/completions",
                          json={"prompt": list(range(1000 * k + 1, 1000 * k + 40)),
                                "max_tokens": 1}, timeout=5)
        publisher = sim.servers[0].replica.kv_publisher
        assert publisher is not None
        deadline = time.monotonic() + 10
        while publisher.sent < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        sock.connect(f"tcp://127.0.0.1:{base + 2}")
        sock.send_multipart([b"", (1).to_bytes(8, "big")])
        replies = []
        while sock.poll(2000):
            _, seq, payload = sock.recv_multipart()
            replies.append((int.from_bytes(seq, "big", signed=True), payload))
            if replies[-1][0] == -1:
                break
    finally:
        sock.close()
        sim.stop()
    assert [seq for seq, _ in replies] == [1, 2, -1] and replies[-1][1] == b""
    assert [len(e["token_ids"]) for e in msgspec.msgpack.decode(replies[0][1])[1]] == [32]


def test_a_restart_is_a_new_process_sequence_from_zero_new_hashes(monkeypatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    base = consecutive_free_ports(2)
    sim = build_simulation(simulation_args(rate=0, port=base, kv_events_port=base + 1))
    sub = subscriber(f"tcp://127.0.0.1:{base + 1}")
    try:
        sim.start()
        before, prompt = post_until_event(f"http://127.0.0.1:{base}", sub)
        sim.servers[0].replica.restart()  # the cache is empty again: the prompt stores again
        after, _ = post_until_event(f"http://127.0.0.1:{base}", sub, prompt)
    finally:
        sub.close()
        sim.stop()
    assert int.from_bytes(after[0][1], "big") == 0 < int.from_bytes(before[-1][1], "big") + 1
    h_before = msgspec.msgpack.decode(before[0][2])[1][0]["block_hashes"]
    h_after = msgspec.msgpack.decode(after[0][2])[1][0]["block_hashes"]
    assert h_before != h_after  # same content, a new process's seed
    assert stored_token_ids(before)[0] == stored_token_ids(after)[0] == prompt[:32]


def test_hashes_are_seeded_per_process_unless_pythonhashseed(monkeypatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    a, b = KVEventSink(16), KVEventSink(16)
    assert a.hash(12345) != b.hash(12345)
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    a, b = KVEventSink(16), KVEventSink(16)
    assert a.hash(12345) == b.hash(12345) and a.hash(1) != a.hash(2)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"kv_events_port": 70000}, "--kv-events-port is out of range"),
    ({"kv_events_replay_port": 5558}, "--kv-events-replay-port needs --kv-events-port"),
    ({"kv_events_port": 8001, "replicas": 2}, "--port and --kv-events-port overlap"),
    ({"kv_events_port": 5557, "kv_events_replay_port": 5557},
     "--kv-events-port and --kv-events-replay-port overlap"),
])
def test_bad_kv_events_flags_are_one_clear_error(overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        build_simulation(simulation_args(rate=0, **overrides))


def test_a_taken_kv_events_port_is_one_line_naming_it() -> None:
    base = consecutive_free_ports(2)
    taken = zmq.Context.instance().socket(zmq.PUB)
    taken.setsockopt(zmq.LINGER, 0)
    try:
        taken.bind(f"tcp://127.0.0.1:{base + 1}")
        proc = subprocess.run(
            [sys.executable, "-m", "prefixwatch.cli", "simulate", "--rate", "0", "--port",
             str(base), "--kv-events-port", str(base + 1)],
            capture_output=True, text=True, timeout=60)
    finally:
        taken.close()
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and f"tcp://127.0.0.1:{base + 1}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_sigterm_ends_a_publishing_simulator_within_two_seconds() -> None:
    base = consecutive_free_ports(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefixwatch.cli", "simulate", "--rate", "20", "--port",
         str(base), "--kv-events-port", str(base + 1)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sub = subscriber(f"tcp://127.0.0.1:{base + 1}")
    try:
        assert sub.poll(20000), "no KV event within 20 s"
        proc.send_signal(signal.SIGTERM)
        start = time.monotonic()
        proc.wait(timeout=10)
        assert time.monotonic() - start < 2.0
        assert proc.returncode == 0
    finally:
        sub.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_offset_endpoint_is_vllms_port_offset() -> None:
    assert offset_endpoint("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint("tcp://127.0.0.1:0", 2) == "tcp://127.0.0.1:0"  # free ports
