"""One target's KV event source: its mirror, its sequence tracking and its stream's health.

Every message of the target's stream goes through ``ingest`` (from whichever socket carried
it: the target's own subscription or the shared listen socket). Sequence numbers are tracked
per topic; a gap is filled from the replay endpoint when the target names one (the caller
passes ``replay``), and what stays missing is counted as lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from prefixwatch.core.kv import codec
from prefixwatch.core.kv.codec import BatchDecoder, DecodeError
from prefixwatch.core.kv.mirror import FleetContent, MirrorSnapshot, TargetMirror
from prefixwatch.core.vocab import exposition

log = logging.getLogger("prefixwatch.exporter.kvsubscriber")
#: Named divergences a source keeps for the culprit (a few minutes of a busy engine).
NAMED_DIVERGENCES = 4096

#: Batches held while the target's model is not known yet (its first poll), at most.
HOLD_MESSAGES = 1024
HOLD_SECONDS = 10.0

#: replay(start_seq) -> the (seq, payload) pairs the endpoint sent back, or the reason it failed.
Replay = Callable[[int], "list[tuple[int, bytes]] | str"]


class FleetRegistry:
    """One content tree per model, shared by every target serving it."""

    def __init__(self, max_blocks: int = exposition.KV_MAX_CONTENT_BLOCKS) -> None:
        self.max_blocks = max_blocks
        self._lock = threading.Lock()
        self._fleets: dict[str, FleetContent] = {}

    def fleet(self, model: str) -> FleetContent:
        with self._lock:
            fleet = self._fleets.get(model)
            if fleet is None:
                fleet = self._fleets[model] = FleetContent(model, self.max_blocks)
            return fleet


def model_from_topic(topic: bytes) -> str | None:
    """The model of an llm-d style topic ``kv@<pod>@<model>``; None for any other topic."""
    text = topic.decode("utf-8", "replace")
    parts = text.split("@", 2)
    return parts[2] if len(parts) == 3 and parts[0] == "kv" and parts[2] else None


class KvSource:
    """The KV event state of one target (thread-safe: one stream thread writes)."""

    def __init__(self, target: str, fleets: FleetRegistry,
                 model_hint: Callable[[], str | None] = lambda: None,
                 max_message_bytes: int = exposition.KV_MAX_MESSAGE_BYTES,
                 max_resident: int = exposition.KV_MAX_RESIDENT_BLOCKS) -> None:
        self.target = target
        self.fleets = fleets
        self.model_hint = model_hint
        self.max_message_bytes = max_message_bytes
        self.max_resident = max_resident
        self.lock = threading.Lock()
        #: The recent divergences the kind namer named: (time, model, kind, token position),
        #: for the culprit (core/story.py); bounded.
        self.named: deque[tuple[float, str, str, int]] = deque(maxlen=NAMED_DIVERGENCES)
        self.mirror: TargetMirror | None = None
        self.connected = False
        self.decoding = True
        self.lost = 0
        self.messages = 0
        self.errors: dict[str, int] = {}  # stream-level reasons (the mirror keeps its own)
        #: New chains by what varies where they diverge (filled by the tokenizer thread).
        self.kinds: dict[str, int] = {}
        #: Tokens no full block covered (the ledger's tail), since the exporter followed the
        #: target: written by the event ledger at each sample, exposed as the ``tail`` part.
        self.tail_tokens = 0
        self._next: dict[bytes, int] = {}
        self._decoder = BatchDecoder()
        self._held: list[codec.Batch] = []  # batches before the model is known
        self._held_since = 0.0
        self._held_topic = b""

    # -- the stream ------------------------------------------------------------------------------

    def count(self, reason: str, n: int = 1) -> None:
        with self.lock:
            self.errors[reason] = self.errors.get(reason, 0) + n

    def set_connected(self, connected: bool, stopping: bool = False) -> None:
        """The stream's state; ``stopping`` when the exporter itself ends it (no disconnect
        is counted or warned about then)."""
        with self.lock:
            was = self.connected
            if was and not connected and not stopping:
                self.errors["disconnected"] = self.errors.get("disconnected", 0) + 1
            self.connected = connected
        if was != connected:
            if stopping:
                log.debug("kv events of %s: unsubscribed (stopping)", self.target)
                return
            log.log(logging.INFO if connected else logging.WARNING,
                    "kv events of %s: %s", self.target,
                    "connected" if connected else "disconnected (reconnecting with backoff)")

    def ingest(self, frames: list[bytes], replay: Replay | None = None) -> None:
        """One received message; never raises on bad input (it is counted instead)."""
        if sum(map(len, frames)) > self.max_message_bytes:
            self.count(codec.TOO_LARGE)
            return
        try:
            topic, seq, payload = codec.split_message(frames)
        except DecodeError as exc:
            self.count(exc.reason)
            return
        expected = self._next.get(topic)
        restarted = False
        if expected is not None and seq != expected:
            if seq == 0 or seq < expected - exposition.KV_RECEIVE_HWM:
                log.info("kv events of %s: the sequence restarted (%d after %d); the mirror "
                         "starts again", self.target, seq, expected - 1)
                self._restart()
                restarted = True
            elif seq < expected:
                return  # a duplicate (a replay overlapping the live stream)
            else:
                self._fill(topic, expected, seq, replay)
        self._next[topic] = seq + 1
        self._apply(topic, payload)
        if restarted:  # counted last: who sees the restart sees the new engine's first batch
            self.count("sequence_restart")

    def _fill(self, topic: bytes, start: int, upto: int, replay: Replay | None) -> None:
        """Messages ``start``..``upto - 1`` are missing: replay them, count what stays lost."""
        got: list[tuple[int, bytes]] = []
        if replay is not None:
            answer = replay(start)
            if isinstance(answer, str):
                self.count(answer)
                log.warning("kv events of %s: replay from %d failed (%s)", self.target, start,
                            answer)
            else:
                got = sorted((s, p) for s, p in answer if start <= s < upto)
        have = set()
        for seq, payload in got:
            if seq not in have:
                have.add(seq)
                self._apply(topic, payload)
        missing = (upto - start) - len(have)
        if missing:
            with self.lock:
                self.lost += missing
            log.warning("kv events of %s: %d message(s) lost before sequence %d", self.target,
                        missing, upto)

    def _apply(self, topic: bytes, payload: bytes) -> None:
        try:
            batch = self._decoder.decode(payload)
        except DecodeError as exc:
            self.count(exc.reason)
            with self.lock:
                self.decoding = False
            return
        mirror = self.mirror
        if mirror is None:
            model = model_from_topic(topic) or self.model_hint()
            if model is None and self._may_hold():
                # The model is not known yet (the target's first poll is under way): hold the
                # first batches rather than file them under no model for good.
                if not self._held:
                    self._held_since = time.monotonic()
                    self._held_topic = topic
                self._held.append(batch)
                with self.lock:
                    self.messages += 1
                    self.decoding = True
                return
            mirror = self._release(topic, model or "")
        if self._into(mirror, batch):
            with self.lock:
                self.messages += 1
                self.decoding = True

    def idle(self) -> None:
        """Nothing arrived for a while (called by the thread that reads this stream): the
        batches held for the model go into the mirror as soon as the model is known, or once
        they have waited their time, not at the engine's next message, which an idle engine
        may not send for minutes."""
        if self.mirror is not None or not self._held:
            return
        model = self.model_hint()
        if model is None and self._may_hold():
            return
        self._release(self._held_topic, model or "")

    def _may_hold(self) -> bool:
        """Whether a batch may still wait for the model (a bounded count, a bounded time)."""
        waited = time.monotonic() - self._held_since if self._held else 0.0
        return len(self._held) < HOLD_MESSAGES and waited < HOLD_SECONDS

    def _release(self, topic: bytes, model: str) -> TargetMirror:
        """The mirror starts under ``model``, with the batches held until then."""
        mirror = self._start_mirror(topic, model)
        held, self._held = self._held, []
        for early in held:
            self._into(mirror, early)
        return mirror

    def _into(self, mirror: TargetMirror, batch: codec.Batch) -> bool:
        try:
            mirror.apply(batch)
        except (TypeError, ValueError, OverflowError, KeyError, IndexError) as exc:
            # Values the types allow but the mirror cannot hold: the rest of the batch is
            # lost, the stream goes on.
            self.count(codec.MALFORMED)
            log.debug("kv events of %s: batch not applied (%s)", self.target, exc)
            return False
        return True

    def _start_mirror(self, topic: bytes, model: str) -> TargetMirror:
        mirror = TargetMirror(self.fleets.fleet(model), max_resident=self.max_resident)
        with self.lock:
            self.mirror = mirror
        log.info("kv events of %s: first message (topic %r, model %r)", self.target,
                 topic.decode("utf-8", "replace"), model)
        return mirror

    def _restart(self) -> None:
        """The engine started again: its blocks are gone, those held before the model was
        known included (they belong to the engine that stopped)."""
        if self.mirror is not None:
            with self.mirror.fleet.lock:
                self.mirror.clear()
        self._held = []
        self._next.clear()

    # -- reading ---------------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        with self.lock:
            return self.connected and self.decoding

    def view(self) -> StreamView:
        """The stream as it stands now (its mirror's counters read once)."""
        snap = self.mirror.snapshot() if self.mirror is not None else None
        with self.lock:
            errors = dict(self.errors)
            up, lost, messages = self.connected and self.decoding, self.lost, self.messages
            kinds = dict(self.kinds)
        if snap is not None:
            for reason, n in snap.errors.items():
                errors[reason] = errors.get(reason, 0) + n
        return StreamView(self.target, up, lost, messages, MappingProxyType(errors), snap,
                          self.tail_tokens, MappingProxyType(kinds))


@dataclass(frozen=True)
class StreamView:
    """One target's KV event stream as a reader sees it at one moment."""

    target: str
    up: bool
    lost: int
    messages: int
    #: Every error reason's count: the stream's and its mirror's.
    errors: Mapping[str, int]
    #: The mirror's counters; None before the stream's first message made a mirror.
    snapshot: MirrorSnapshot | None
    #: The ledger's tail part (tokens no full block covered) since the target was followed.
    tail_tokens: int
    #: New chains by what varies where they diverge.
    kinds: Mapping[str, int]
