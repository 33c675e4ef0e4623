"""The ZMQ side of the KV event sources: one thread per subscription, none shared with polling.

- ``Subscription``: a SUB socket that connects to one engine's PUB endpoint (vLLM binds
  ``tcp://*:5557``). libzmq reconnects by itself with a doubling backoff
  (``RECONNECT_IVL`` .. ``RECONNECT_IVL_MAX``); heartbeats drop a publisher that stopped
  answering, and a peer that never completes the handshake is dropped after
  ``HANDSHAKE_IVL``. The socket monitor says when the stream is connected.
- ``Listener``: a SUB socket that binds, for engines that connect out (llm-d's layout); each
  message goes to the target its topic maps to.

Every socket has a receive high-water mark (a flooding publisher loses messages, counted by
sequence, never memory) and a per-frame size cap; every loop waits at most ``TICK`` seconds,
so ``stop`` ends it within a fraction of a second.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import zmq
from zmq.utils.monitor import recv_monitor_message

from prefixwatch.core.kv import codec
from prefixwatch.core.vocab import exposition
from prefixwatch.exporter.kvsubscriber.source import KvSource

log = logging.getLogger("prefixwatch.exporter.kvsubscriber")

TICK = 0.1
HEARTBEAT_MS = 2000
HANDSHAKE_MS = 5000


def _tune(sock: zmq.Socket, max_message_bytes: int) -> None:
    first, longest = exposition.KV_RECONNECT_SECONDS
    sock.setsockopt(zmq.RCVHWM, exposition.KV_RECEIVE_HWM)
    sock.setsockopt(zmq.LINGER, 0)
    # The per-frame hard cap (the connection drops past it); messages between the soft limit
    # and this are read and counted as too_large.
    sock.setsockopt(zmq.MAXMSGSIZE, 4 * max_message_bytes)
    sock.setsockopt(zmq.RECONNECT_IVL, int(first * 1000))
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, int(longest * 1000))
    sock.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)


class Replayer:
    """The replay endpoint of one target (a ROUTER): ``(start)`` -> messages or a reason.

    One DEALER socket, used only from the subscription's thread; the whole exchange (request
    to the end marker) has one deadline; a reply that misses it is dropped with its socket."""

    def __init__(self, ctx: zmq.Context, endpoint: str,
                 timeout: float = exposition.KV_REPLAY_TIMEOUT_SECONDS,
                 max_messages: int = exposition.KV_RECEIVE_HWM,
                 stop: threading.Event | None = None) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.timeout = timeout
        self.max_messages = max_messages
        self.stop = stop or threading.Event()
        self._sock: zmq.Socket | None = None

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            sock = self.ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVHWM, self.max_messages + 1)
            sock.connect(self.endpoint)
            self._sock = sock
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def __call__(self, start: int) -> list[tuple[int, bytes]] | str:
        sock = self._socket()
        deadline = time.monotonic() + self.timeout
        try:
            sock.send_multipart([b"", start.to_bytes(8, "big")], flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            self.close()
            return "replay_timeout"
        out: list[tuple[int, bytes]] = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.stop.is_set():
                self.close()  # a late answer must not be read as the next one's
                return "replay_timeout"
            if not sock.poll(int(min(left, TICK) * 1000) + 1):
                continue
            frames = sock.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]
            if len(frames) == 3:  # some publishers echo the topic first
                frames = frames[1:]
            if len(frames) != 2 or len(frames[0]) != 8:
                self.close()
                return "replay_error"
            if frames[0] == codec.REPLAY_END:
                return out
            out.append((int.from_bytes(frames[0], "big"), frames[1]))
            if len(out) > self.max_messages:
                self.close()
                return "replay_error"


class _Loop:
    """A thread that reads one SUB socket until stopped."""

    name = "kv-events"

    def __init__(self, ctx: zmq.Context, endpoint: str, stop: threading.Event) -> None:
        self.ctx = ctx
        self.endpoint = endpoint
        self.stop = stop
        self.thread = threading.Thread(target=self._guarded, name=self.name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def _guarded(self) -> None:
        try:
            self.run()
        except zmq.ContextTerminated:
            return
        except zmq.ZMQError as exc:  # an endpoint that cannot be bound or connected
            log.error("kv events: %s: %s; this stream stays down", self.endpoint, exc)
            self.on_failure()
        except Exception:  # a bug must not end silently: it is logged, the exporter goes on
            log.exception("kv events: %s failed", self.endpoint)
            self.on_failure()

    def on_failure(self) -> None:
        pass

    def run(self) -> None:  # pragma: no cover - subclasses
        raise NotImplementedError

    def read(self, sock: zmq.Socket, monitor: zmq.Socket, connected: Callable[[int], None],
             handle: Callable[[list[bytes]], None], idle: Callable[[], None]) -> None:
        """Read ``sock`` until stopped: each message to ``handle``, in bursts; the count of
        connected peers (handshakes less disconnects) to ``connected``; ``idle`` after a tick
        with no message. Closes both sockets."""
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        peers = 0
        try:
            while not self.stop.is_set():
                ready = dict(poller.poll(int(TICK * 1000)))
                if monitor in ready:
                    event = recv_monitor_message(monitor)["event"]
                    peers = peers + 1 if event == zmq.EVENT_HANDSHAKE_SUCCEEDED else max(
                        0, peers - 1)
                    connected(peers)
                if sock in ready:
                    for _ in range(256):  # a burst, then look at the monitor and stop again
                        try:
                            frames = sock.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        handle(frames)
                else:
                    idle()
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)
            sock.close(linger=0)


class Subscription(_Loop):
    """Connects to one target's PUB endpoint (and its replay endpoint, if any)."""

    def __init__(self, ctx: zmq.Context, source: KvSource, endpoint: str,
                 stop: threading.Event, topic: str = "", replay: str | None = None,
                 replay_timeout: float = exposition.KV_REPLAY_TIMEOUT_SECONDS) -> None:
        super().__init__(ctx, endpoint, stop)
        self.name = f"kv-events-{source.target}"
        self.thread.name = self.name
        self.source = source
        self.topic = topic
        self.replayer = (Replayer(ctx, replay, replay_timeout, stop=stop) if replay else None)

    def on_failure(self) -> None:
        self.source.set_connected(False)

    def run(self) -> None:
        sock = self.ctx.socket(zmq.SUB)
        _tune(sock, self.source.max_message_bytes)
        sock.setsockopt(zmq.SUBSCRIBE, self.topic.encode())
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                          | zmq.EVENT_DISCONNECTED)
        sock.connect(self.endpoint)
        log.info("kv events of %s: subscribing to %s", self.source.target, self.endpoint)
        try:
            self.read(sock, monitor, lambda peers: self.source.set_connected(peers > 0),
                      lambda frames: self.source.ingest(frames, self.replayer), self.source.idle)
        finally:
            self.source.set_connected(False, stopping=self.stop.is_set())
            if self.replayer is not None:
                self.replayer.close()


class Listener(_Loop):
    """Binds one endpoint for engines that connect out; routes each topic to its target."""

    name = "kv-events-listen"

    def __init__(self, ctx: zmq.Context, endpoint: str, stop: threading.Event,
                 route: Callable[[bytes], KvSource | None], sources: list[KvSource],
                 unrouted: KvSource) -> None:
        super().__init__(ctx, endpoint, stop)
        self.route = route
        self.sources = sources
        self.unrouted = unrouted  # where messages of unknown topics are counted
        self.bound: str | None = None
        self.peers = 0  # engines connected

    def run(self) -> None:
        sock = self.ctx.socket(zmq.SUB)
        _tune(sock, max(s.max_message_bytes for s in self.sources) if self.sources
              else exposition.KV_MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED
                                          | zmq.EVENT_DISCONNECTED)
        sock.bind(self.endpoint)
        self.bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        log.info("kv events: listening on %s for %d target(s)", self.bound, len(self.sources))

        def connected(peers: int, stopping: bool = False) -> None:
            # A target is up once its own topic has spoken, while any engine is connected.
            self.peers = peers
            for source in self.sources:
                source.set_connected(peers > 0 and source.messages > 0, stopping)

        try:
            self.read(sock, monitor, connected, self._route, self._idle)
        finally:
            connected(0, stopping=self.stop.is_set())

    def _idle(self) -> None:
        for source in self.sources:
            source.idle()

    def _route(self, frames: list[bytes]) -> None:
        target = self.route(frames[0]) if len(frames) == 3 else None
        if target is not None:
            target.ingest(frames)
            if self.peers and not target.connected:
                target.set_connected(True)
        else:
            self.unrouted.count("unknown_topic" if len(frames) == 3 else codec.FRAMES)
