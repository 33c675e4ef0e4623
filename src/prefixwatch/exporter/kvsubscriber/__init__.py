"""KV event sources of the exporter: subscriptions, listen mode, and their series.

``KvEvents`` owns one ``KvSource`` per target that has a stream (``kv_events`` on the target,
or a topic routed to it by ``kv_events_listen``), one ZMQ context and one thread per socket.
Nothing here runs on the poll workers' threads: a stream's trouble never delays a poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import zmq

from prefixwatch.core.vocab import exposition
from prefixwatch.exporter.config import ExporterConfig
from prefixwatch.exporter.kvsubscriber.kinds import KindNamer
from prefixwatch.exporter.kvsubscriber.source import FleetRegistry, KvSource, StreamView
from prefixwatch.exporter.kvsubscriber.subscriber import Listener, Subscription

log = logging.getLogger("prefixwatch.exporter.kvsubscriber")

__all__ = ["KvEvents", "KvSource", "StreamView"]


class KvEvents:
    def __init__(self, config: ExporterConfig,
                 model_hint: Callable[[str], str | None] = lambda _target: None,
                 fleets: FleetRegistry | None = None) -> None:
        self.config = config
        self.fleets = fleets or FleetRegistry()
        self.sources: dict[str, KvSource] = {}
        self._stop = threading.Event()
        self._ctx: zmq.Context | None = None
        self._loops: list = []
        self.listener: Listener | None = None
        self._topics: dict[bytes, KvSource] = {}
        for target in config.targets:
            # In listen mode every target without an endpoint of its own may connect out.
            if target.kv_events or config.kv_events_listen is not None:
                self.sources[target.name] = KvSource(
                    target.name, self.fleets, lambda name=target.name: model_hint(name))
        self._listened = {t.name for t in config.targets if t.kv_events is None}
        if config.kv_events_listen is not None:
            self.unrouted = KvSource(f"listen:{config.kv_events_listen}", self.fleets)
            for topic, name in config.kv_events_topics.items():
                self._topics[topic.encode()] = self._source_for(name)
            for target in config.targets:
                if target.kv_events_topic and target.kv_events is None:
                    self._topics[target.kv_events_topic.encode()] = self._source_for(
                        target.name)

    def _source_for(self, name: str) -> KvSource:
        source = self.sources.get(name)
        if source is None:
            source = self.sources[name] = KvSource(name, self.fleets)
        return source

    @property
    def enabled(self) -> bool:
        return bool(self.sources) or self.config.kv_events_listen is not None

    def route(self, topic: bytes) -> KvSource | None:
        """The target of a topic: the map, then llm-d's ``kv@<pod>@<model>`` with the pod
        named as a target, then a topic that is a target's name."""
        source = self._topics.get(topic)
        if source is not None:
            return source
        text = topic.decode("utf-8", "replace")
        parts = text.split("@", 2)
        name = parts[1] if len(parts) == 3 and parts[0] == "kv" else text
        source = self.sources.get(name)
        if source is not None and name in self._listened:
            return source
        return None

    def start(self) -> None:
        if not self.enabled:
            return
        self._ctx = zmq.Context()
        for target in self.config.targets:
            if target.kv_events:
                self._loops.append(Subscription(
                    self._ctx, self.sources[target.name], target.kv_events, self._stop,
                    topic=target.kv_events_topic, replay=target.kv_events_replay))
        if self.config.kv_events_listen is not None:
            listened = [s for n, s in self.sources.items() if n in self._listened]
            self.listener = Listener(self._ctx, self.config.kv_events_listen, self._stop,
                                     self.route, listened, self.unrouted)
            self._loops.append(self.listener)
        self._loops.append(KindNamer(self.sources, {t.name: t.url for t in self.config.targets},
                                     self._stop))
        for loop in self._loops:
            loop.start()

    def stop(self, timeout: float = 0.5) -> None:
        """Ends every loop within ``timeout`` in all (each waits at most its tick): one
        deadline for every loop, so many streams do not add up past SIGTERM's 2 s."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for loop in self._loops:
            loop.join(max(0.0, deadline - time.monotonic()))
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def name_pending(self) -> None:
        """Name the divergences still waiting for the kind namer's next tick, now (a
        one-shot reader, `status`, wants them all before it reports)."""
        for loop in self._loops:
            if isinstance(loop, KindNamer):
                loop.name_once()

    def all_sources(self) -> list[KvSource]:
        out = list(self.sources.values())
        if self.config.kv_events_listen is not None:
            out.append(self.unrouted)
        return out


def error_reasons(errors: dict[str, int]) -> list[tuple[str, int]]:
    """Every known reason (pre-initialised to 0), then any other the stream produced."""
    out = [(r, errors.get(r, 0)) for r in exposition.KV_ERROR_REASONS]
    out += sorted((r, n) for r, n in errors.items() if r not in exposition.KV_ERROR_REASONS)
    return out
