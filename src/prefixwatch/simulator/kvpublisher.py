"""vLLM's KV cache event stream, published by a simulated replica in vLLM 0.33's wire format.

What vLLM does (vllm/distributed/kv_events.py, vllm/v1/core/block_pool.py, and the recording of
vLLM 0.33's own scheduler and ``ZmqEventPublisher`` under tests/fixtures/kv_events/):

* **Wire.** A ZMQ PUB socket sends one multipart message per engine step that produced events:
  ``(topic, sequence as 8 bytes big-endian, payload)``; the payload is msgspec msgpack of
  ``KVEventBatch``, a positional array ``[ts, events, data_parallel_rank]``. Each event is a map
  tagged by ``"type"`` whose fields at their default are left out. ``vllm serve`` binds the
  endpoint when it holds ``*`` (``tcp://*:5557``). An optional ROUTER replay endpoint answers an
  8-byte big-endian start sequence with every buffered ``(seq, payload)`` from it on, then
  ``(-1, b"")``.
* **When.** ``BlockStored`` fires when a request's full blocks are cached (once per request
  and step, with the token ids of the newly cached blocks and the hash of the block before
  them, None at a prompt's start). ``BlockRemoved`` fires lazily, one block per event, when a
  cached free block is reused for new content (an eviction); freeing a block emits nothing.
  Two physical copies of one content are stored and removed separately.
* **CPU tier.** vLLM's SimpleCPUOffloadConnector publishes the host pool's own events, with
  ``medium="CPU"``: one ``BlockStored`` per block when its copy completes (its token ids, the
  chain's previous block hash as parent, ``locality="LOCAL"``, no ``extra_keys``), and a
  ``BlockRemoved`` when the host pool evicts it. A block loaded back from the host is cached
  on the device again, so the device publishes a ``GPU`` ``BlockStored`` for it as well.
* **Hashes** are seeded per process unless ``PYTHONHASHSEED`` is set: two replicas publish
  different hashes for the same content, as two ``vllm serve`` processes do. Here a replica's
  hash is a bijective mix of the pool's chained block id with that seed.

Stated approximations: per-block ``extra_keys`` carry the LoRA name and, on a prompt's first
block, the ``cache_salt`` (vLLM's also carry multimodal hashes, which the simulator has none
of); ``lora_id`` is the adapter's 1-based position in ``--lora-modules`` order.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from prefixwatch.core.kv.codec import (
    REPLAY_END,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
)

log = logging.getLogger("prefixwatch.simulate")

MASK = (1 << 64) - 1
_MIX = 0x9E3779B97F4A7C15  # odd: multiplication by it is a bijection mod 2**64
MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"
#: vLLM's KVEventsConfig defaults.
DEFAULT_HWM = 100_000
DEFAULT_BUFFER_STEPS = 10_000
DEFAULT_MAX_QUEUE = 100_000
#: SIGTERM must end the process within 2 s: the publisher thread's longest wait.
_POLL_S = 0.05


def process_hash_seed() -> int | None:
    """vLLM seeds its block hashes from PYTHONHASHSEED when set, else at random per process."""
    value = os.environ.get("PYTHONHASHSEED")
    if value is None or value == "random":
        return None
    try:
        return int(value) & MASK
    except ValueError:
        return None


class StepEvents:
    """An engine step's events in the order they are made, under one lock (the engine thread
    adds, the publisher's flush takes them whole): what vLLM's and SGLang's sinks share."""

    def __init__(self, *first: Any) -> None:
        self.events: list[Any] = list(first)
        self.lock = threading.Lock()

    def _add(self, *events: Any) -> None:
        with self.lock:
            self.events.extend(events)

    def take(self) -> list[Any]:
        """The step's events; the next step starts empty."""
        with self.lock:
            events, self.events = self.events, []
        return events


class KVEventSink(StepEvents):
    """One replica's events of the current engine step, in the order vLLM queues them.

    The block pool and the host tier call ``stored`` and ``removed`` with their chained block
    ids; ``take`` hands the step's events to the publisher and starts the next step.
    """

    def __init__(self, block_size: int, seed: int | None = None,
                 lora_ids: dict[str, int] | None = None) -> None:
        super().__init__()
        self.block_size = block_size
        seed = process_hash_seed() if seed is None else seed
        self.seed = int.from_bytes(os.urandom(8), "big") if seed is None else seed & MASK
        self.lora_ids = dict(lora_ids or {})

    def hash(self, block_id: int) -> int:
        """The hash this process publishes for a chained block id."""
        return (((block_id ^ self.seed) * _MIX) & MASK) ^ (self.seed >> 7)

    @staticmethod
    def _lora(extra_keys: Hashable) -> str | None:
        return extra_keys[0] if isinstance(extra_keys, tuple) and extra_keys else None

    def _block_extra_keys(self, extra_keys: Hashable, first_position: int, n: int
                          ) -> list[tuple[Any, ...] | None]:
        lora = self._lora(extra_keys)
        salt = extra_keys[1] if isinstance(extra_keys, tuple) and len(extra_keys) > 1 else None
        out: list[tuple[Any, ...] | None] = []
        for position in range(first_position, first_position + n):
            keys = tuple(k for k in (lora, salt if position == 0 else None) if k is not None)
            out.append(keys or None)
        return out

    def stored(self, parent_id: int | None, block_ids: Sequence[int], tokens: Sequence[int],
               extra_keys: Hashable = None, first_position: int = 0) -> None:
        """A device ``BlockStored``: ``block_ids`` cached after ``parent_id`` (None at a
        prompt's start), ``tokens`` their token ids, the first at block ``first_position``."""
        if not block_ids:
            return
        lora = self._lora(extra_keys)
        event = BlockStored(
            block_hashes=[self.hash(b) for b in block_ids],
            parent_block_hash=None if parent_id is None else self.hash(parent_id),
            token_ids=list(tokens), block_size=self.block_size,
            lora_id=self.lora_ids.get(lora) if lora else None, medium=MEDIUM_GPU,
            lora_name=lora,
            extra_keys=self._block_extra_keys(extra_keys, first_position, len(block_ids)),
            group_idx=0, kv_cache_spec_kind="full_attention")
        self._add(event)

    def stored_host(self, parent_id: int | None, block_id: int, tokens: Sequence[int],
                    extra_keys: Hashable = None) -> None:
        """A host-tier ``BlockStored`` (one block), as the simple CPU offload connector's."""
        lora = self._lora(extra_keys)
        event = BlockStored(
            block_hashes=[self.hash(block_id)],
            parent_block_hash=None if parent_id is None else self.hash(parent_id),
            token_ids=list(tokens), block_size=self.block_size,
            lora_id=self.lora_ids.get(lora) if lora else None, medium=MEDIUM_CPU,
            lora_name=lora, group_idx=0, kv_cache_spec_kind="full_attention",
            locality="LOCAL")
        self._add(event)

    def removed(self, block_id: int, medium: str = MEDIUM_GPU) -> None:
        event = BlockRemoved(block_hashes=[self.hash(block_id)], medium=medium, group_idx=0)
        self._add(event)

    def cleared(self) -> None:
        self._add(AllBlocksCleared())


def encode_batch(events: list[KVCacheEvent], ts: float | None = None,
                 data_parallel_rank: int = 0) -> bytes:
    """The payload vLLM's publisher sends for one step's events."""
    batch = KVEventBatch(ts=time.time() if ts is None else ts, events=events,
                         data_parallel_rank=data_parallel_rank)
    return msgspec.msgpack.encode(batch)


class KVEventPublisher:
    """vLLM's ZmqEventPublisher: PUB on ``endpoint`` (bound when it holds ``*``, else
    connected, as vLLM decides), an optional ROUTER replay endpoint with a buffer of the last
    ``buffer_steps`` messages, sequence numbers from 0, a high-water mark after which PUB drops.

    ``publish`` never blocks the engine: a full queue drops the batch (counted in
    ``dropped``), as vLLM's bounded queue would stall instead; a simulator must not.
    """

    def __init__(self, endpoint: str, topic: str = "", replay_endpoint: str | None = None,
                 hwm: int = DEFAULT_HWM, buffer_steps: int = DEFAULT_BUFFER_STEPS,
                 max_queue_size: int = DEFAULT_MAX_QUEUE, data_parallel_rank: int = 0,
                 bind: bool | None = None, encode: Any = None) -> None:
        self.topic = topic.encode("utf-8")
        #: The payload of one step's events (vLLM's batch; SGLang's for an SGLang replica).
        self._encode = encode or encode_batch
        self.data_parallel_rank = data_parallel_rank
        self._ctx = zmq.Context.instance()
        self._queue: queue.Queue[list[KVCacheEvent] | None] = queue.Queue(max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._seq_lock = threading.Lock()
        #: Batches handed over, sent, and dropped (queue full or past the high-water mark).
        self.published = 0
        self.sent = 0
        self.dropped = 0
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket | None = None
        try:
            if _binds(endpoint) if bind is None else bind:
                self._pub.bind(_ephemeral(endpoint))
            else:
                self._pub.connect(endpoint)
            if replay_endpoint:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(_ephemeral(replay_endpoint))
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise OSError(exc.errno, f"cannot bind KV events endpoint {endpoint}: {exc}"
                          ) from exc
        self.endpoint = _last_endpoint(self._pub, endpoint)
        self.replay_endpoint = (_last_endpoint(self._replay, replay_endpoint)
                                if self._replay is not None and replay_endpoint else None)
        self._abort = False
        self._thread: threading.Thread | None = None

    # -- the engine's side ---------------------------------------------------------------------

    def publish(self, events: list[KVCacheEvent]) -> None:
        if not events:
            return
        self.published += 1
        try:
            self._queue.put_nowait(events)
        except queue.Full:
            self.dropped += 1

    def restart(self) -> None:
        """A new engine process: what the old one had queued is gone, sequence numbers start
        again from 0, the replay buffer is empty."""
        with self._seq_lock:
            while True:
                try:
                    if self._queue.get_nowait() is None:
                        self._queue.put_nowait(None)  # a stop() under way keeps its sentinel
                        break
                except queue.Empty:
                    break
            self._seq = 0
            self._buffer.clear()

    # -- the thread ----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._abort = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="kv-events")
        self._thread.start()

    def _run(self) -> None:
        while not self._abort:
            if self._replay is not None and self._replay.poll(0):
                self._service_replay()
            try:
                events = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if events is None:
                break  # stop(): everything queued before it was sent
            self._send(events)

    def _send(self, events: list[KVCacheEvent]) -> None:
        payload = self._encode(events, data_parallel_rank=self.data_parallel_rank)
        with self._seq_lock:
            seq = self._seq
            self._seq += 1
            self._buffer.append((seq, payload))
        try:
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload),
                                     flags=zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1  # past the high-water mark: the subscriber sees a gap

    def _service_replay(self) -> None:
        assert self._replay is not None
        try:
            frames = self._replay.recv_multipart(flags=zmq.NOBLOCK)
        except zmq.Again:
            return
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("invalid KV events replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        with self._seq_lock:
            buffered = [item for item in self._buffer if item[0] >= start_seq]
        try:
            for seq, payload in buffered:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload),
                                            flags=zmq.NOBLOCK)
            self._replay.send_multipart((client, b"", REPLAY_END, b""), flags=zmq.NOBLOCK)
        except zmq.Again:
            log.warning("KV events replay client is not reading; replay cut short")

    def stop(self, timeout: float = 1.0) -> None:
        """Send what is queued, for at most ``timeout`` seconds (then drop the rest), and close
        the sockets: SIGTERM ends a simulator within 2 s whatever the backlog."""
        thread = self._thread
        if thread is not None:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                self._abort = True
            thread.join(timeout)
            if thread.is_alive():
                self._abort = True
                thread.join(2 * _POLL_S + 0.1)
            self._thread = None
            if thread.is_alive():
                return  # still inside a send: leave the sockets to the exiting process
        self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None and not sock.closed:
                sock.close(linger=0)


def _binds(endpoint: str) -> bool:
    """vLLM's rule: bind when the endpoint holds a wildcard or is ipc/inproc, else connect."""
    return ("*" in endpoint or "::" in endpoint or endpoint.startswith("ipc://")
            or endpoint.startswith("inproc://"))


def _ephemeral(endpoint: str) -> str:
    """``tcp://HOST:0`` as ZMQ spells "any free port" (``tcp://HOST:*``)."""
    return endpoint[:-2] + ":*" if endpoint.startswith("tcp://") and endpoint.endswith(":0") \
        else endpoint


def _last_endpoint(sock: zmq.Socket, endpoint: str) -> str:
    """The address actually bound (a port 0 or ``*`` resolved), else the one given."""
    try:
        value = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    except zmq.ZMQError:
        return endpoint
    return value or endpoint


def offset_endpoint(endpoint: str, offset: int) -> str:
    """``tcp://HOST:N`` as ``tcp://HOST:N+offset`` (vLLM offsets by data-parallel rank; the
    simulator by replica index)."""
    if offset == 0:
        return endpoint
    head, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or int(port) == 0:
        return endpoint
    return f"{head}:{int(port) + offset}"


@dataclass(frozen=True)
class KVEventsOptions:
    """What ``--kv-events-config`` says, for replica 0; replica i offsets both ports by i."""

    endpoint: str
    topic: str = ""
    replay_endpoint: str | None = None


class KVEvents:
    """A replica's event sink and where its batches go (a ``KVEventPublisher``, or anything
    with ``publish(events)`` and ``restart()``), flushed once per engine step."""

    def __init__(self, sink: Any, publisher: Any) -> None:
        self.sink = sink
        self.publisher = publisher

    def flush(self) -> None:
        events = self.sink.take()
        if events:
            self.publisher.publish(events)

    def restart(self) -> None:
        """A new engine process: what the old one had not sent is gone, the hashes are seeded
        anew (unless PYTHONHASHSEED is set) and the sequence starts from 0."""
        self.sink.take()
        seed = process_hash_seed()
        self.sink.seed = int.from_bytes(os.urandom(8), "big") if seed is None else seed
        self.publisher.restart()
