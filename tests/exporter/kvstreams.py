"""Test helpers for KV event streams: the recordings, and real ZMQ publishers on loopback."""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from tests.conftest import FIXTURES

KV = FIXTURES / "kv_events"


@dataclass(frozen=True)
class Message:
    topic: bytes
    seq: int
    payload: bytes

    @property
    def frames(self) -> list[bytes]:
        return [self.topic, self.seq.to_bytes(8, "big"), self.payload]


def recording(name: str) -> list[Message]:
    """Every ZMQ message of a recording (fleet, offload), in arrival order."""
    out = []
    for line in (KV / name / "kv_events.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.append(Message(row["topic"].encode(), row["seq"],
                           base64.b64decode(row["payload_b64"])))
    return out


def requests_of(name: str) -> list[dict]:
    return [json.loads(line) for line in (KV / name / "requests.jsonl").read_text().splitlines()]


def page_of(name: str, replica: int) -> str:
    return (KV / name / f"metrics_replica-{replica}.txt").read_text()


_SAMPLE = re.compile(r"^(vllm:[a-z_:]+(?:_total|_count|_sum|_bucket)(?:\{[^}]*\})?) (\S+)$")


def zeroed(page: str) -> str:
    """The page as the engine showed it before any request: every counter at 0."""
    return "\n".join(m.group(1) + " 0.0" if (m := _SAMPLE.match(line)) else line
                     for line in page.splitlines()) + "\n"


class Publisher:
    """A PUB socket bound on 127.0.0.1 (as vLLM binds tcp://*:5557), port chosen by the OS."""

    def __init__(self, ctx: zmq.Context, hwm: int = 100_000) -> None:
        # XPUB: a PUB that also hears its subscribers join (wait_subscribed).
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, hwm)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"

    def wait_subscribed(self, timeout: float = 20.0) -> None:
        """Until a subscriber has joined (its subscription message arrived)."""
        if not self.sock.poll(int(timeout * 1000)):
            raise AssertionError("no subscriber joined")
        self.sock.recv()

    def send(self, frames: list[bytes]) -> None:
        self.sock.send_multipart(frames)

    def close(self) -> None:
        self.sock.close(linger=0)


def wait_for(check: Callable[[], bool], timeout: float = 20.0, what: str = "condition"
             ) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def samples(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a registry, keyed by (name, sorted labels)."""
    out = {}
    for family in registry.collect():
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(registry, name: str, **labels: str) -> float | None:
    return samples(registry).get((name, tuple(sorted(labels.items()))))
