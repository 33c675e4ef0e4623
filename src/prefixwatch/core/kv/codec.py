"""vLLM's KV cache event stream, decoded: ZMQ frames in, typed event batches out (pure).

The wire (``vllm/distributed/kv_events.py``): a ZMQ multipart message ``(topic, sequence,
payload)``, the sequence an 8-byte big-endian integer, the payload msgspec msgpack of
``KVEventBatch``, a positional array ``[ts, events, data_parallel_rank]``. vLLM 0.33 encodes each
event as a map tagged by ``"type"`` with fields at their default omitted; other releases (and
SGLang) encode it as a positional array with the tag first. Both decode here into the same
three kinds; unknown fields are ignored, unknown tags are counted, block hashes are 64-bit
integers or bytes (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``).

vLLM's event types are defined here once: the exporter decodes with the fields the mirror
reads (lenient), and vLLM's own classes extend those with the rest of vLLM's fields, which the
simulator encodes with (the bytes vLLM sends). The fast path is one
typed decode of the whole batch; a batch that does not fit the types is
decoded again event by event, so one odd event costs only itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any

import msgspec

BlockHash = int | bytes
#: A token id as the mirror packs it (4 bytes); anything else makes the event malformed.
TokenId = Annotated[int, msgspec.Meta(ge=0, lt=2**32)]

#: Reasons a message or an event is not used (prefixwatch_kv_events_errors_total).
MALFORMED = "malformed_payload"
UNKNOWN_TYPE = "unknown_event_type"
FRAMES = "wrong_frame_count"
BAD_SEQUENCE = "bad_sequence"
TOO_LARGE = "too_large"

#: Message ends of the replay protocol: the sequence -1 (8 bytes, signed big-endian).
REPLAY_END = (-1).to_bytes(8, "big", signed=True)


# -- What the exporter decodes: the fields the mirror reads, every one but the hashes optional --
# (releases before 0.33 lack some; a token id the mirror cannot pack makes the event malformed;
# unknown fields are ignored).


class _StoredFields(msgspec.Struct, gc=False):
    block_hashes: list[BlockHash]
    parent_block_hash: BlockHash | None = None
    token_ids: list[TokenId] = []
    block_size: int = 0
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None


class _RemovedFields(msgspec.Struct, gc=False):
    block_hashes: list[BlockHash]
    medium: str | None = None


# ... as vLLM 0.33's maps, tagged by "type" (fields in any order, defaults omitted) ...
class _MapStored(_StoredFields, tag_field="type", tag="BlockStored"):
    pass


class _MapRemoved(_RemovedFields, tag_field="type", tag="BlockRemoved"):
    pass


class AllBlocksCleared(msgspec.Struct, tag_field="type", tag="AllBlocksCleared", gc=False):
    """The engine dropped every cached block (reset_prefix_cache, a restart)."""


# ... and the positional arrays of other releases: the tag first, the same fields in order.
class _ArrayStored(_StoredFields, array_like=True, tag="BlockStored"):
    pass


class _ArrayRemoved(_RemovedFields, array_like=True, tag="BlockRemoved"):
    pass


class _ArrayCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared", gc=False):
    pass


Event = _MapStored | _MapRemoved | AllBlocksCleared
_ArrayEvent = _ArrayStored | _ArrayRemoved | _ArrayCleared


# -- vLLM's own definitions (vllm/distributed/kv_events.py, 0.33): what an engine encodes --------
# The same classes, with vLLM's fields in vLLM's order: those without a default are always on
# the wire, the rest only when set. The simulator publishes with these, byte for byte as vLLM.


class BlockStored(_MapStored, omit_defaults=True):
    """Blocks the engine cached: ``token_ids`` cover exactly these blocks, in order."""

    parent_block_hash: BlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(_MapRemoved, omit_defaults=True):
    """Cached blocks the engine dropped (vLLM: when a free cached block is reused)."""

    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


#: One of vLLM's events.
KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """vLLM's batch of one engine step's events."""

    ts: float
    events: list[KVCacheEvent]
    data_parallel_rank: int | None = None


# -- SGLang's definitions (python/sglang/srt/disaggregation/kv_events.py): what it encodes ------
# Positional arrays with the tag first, every field on the wire: ``BlockStored`` one page each
# (``block_hashes`` of one signed 64-bit hash, the page's ``token_ids``, ``block_size`` its
# length, ``lora_id`` None, ``medium`` "GPU" or "CPU_PINNED" for the HiCache host pool), the
# batch ``[ts, events, attn_dp_rank]``. The exporter decodes them as the positional events above.


class SGLangBlockStored(msgspec.Struct, array_like=True, tag="BlockStored", gc=False):
    """A page SGLang's radix cache stored (one per page of a new node)."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class SGLangBlockRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved", gc=False):
    """A page SGLang evicted (one per page of an evicted node)."""

    block_hashes: list[int]
    medium: str | None = None


class SGLangAllBlocksCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared",
                             gc=False):
    """SGLang's tree was reset (at start, and on flush_cache)."""


SGLangEvent = SGLangBlockStored | SGLangBlockRemoved | SGLangAllBlocksCleared


class SGLangEventBatch(msgspec.Struct, array_like=True, gc=False):
    """SGLang's batch of one scheduler step's events; ``attn_dp_rank`` is set by its publisher."""

    ts: float
    events: list[SGLangEvent]
    attn_dp_rank: int | None = None


class _MapBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Event]
    data_parallel_rank: int | None = None


class _ArrayBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[_ArrayEvent]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


#: The names each kind is counted under (prefixwatch_kv_events_total{type}).
EVENT_TYPES: tuple[str, ...] = ("BlockStored", "BlockRemoved", "AllBlocksCleared")

_STORED = (BlockStored, _MapStored, _ArrayStored)
_REMOVED = (BlockRemoved, _MapRemoved, _ArrayRemoved)
#: The decoded classes of each kind, for a dispatch on ``type(event)``.
STORED_TYPES = frozenset(_STORED)
REMOVED_TYPES = frozenset(_REMOVED)


@dataclass(slots=True)
class Batch:
    """One decoded message: its events (either encoding) and what was not usable in it."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None
    #: Reason -> count of events dropped from this batch (unknown tags, malformed events).
    dropped: dict[str, int] = field(default_factory=dict)


class DecodeError(ValueError):
    """A message that cannot be used at all; ``reason`` is its counted reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class BatchDecoder:
    """Decodes payloads; one per thread (msgspec decoders are cheap but not shared)."""

    def __init__(self) -> None:
        self._map = msgspec.msgpack.Decoder(_MapBatch)
        self._array = msgspec.msgpack.Decoder(_ArrayBatch)
        self._raw = msgspec.msgpack.Decoder(_RawBatch)
        self._map_event = msgspec.msgpack.Decoder(Event)
        self._array_event = msgspec.msgpack.Decoder(_ArrayEvent)
        self._any = msgspec.msgpack.Decoder()

    def decode(self, payload: bytes) -> Batch:
        """The batch in ``payload``; raises DecodeError when nothing in it is usable."""
        for decoder in (self._map, self._array):
            try:
                got = decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
            return Batch(got.ts, got.events, got.data_parallel_rank)
        return self._one_by_one(payload)

    def _one_by_one(self, payload: bytes) -> Batch:
        try:
            raw = self._raw.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise DecodeError(MALFORMED, f"not a KVEventBatch: {exc}") from None
        batch = Batch(raw.ts, [], raw.data_parallel_rank)
        for item in raw.events:
            event = self._event(item)
            if isinstance(event, str):
                batch.dropped[event] = batch.dropped.get(event, 0) + 1
            else:
                batch.events.append(event)
        return batch

    def _event(self, item: msgspec.Raw) -> Any:
        """The event, or the reason it is dropped."""
        for decoder in (self._map_event, self._array_event):
            try:
                return decoder.decode(item)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        try:
            value = self._any.decode(item)
        except msgspec.DecodeError:
            return MALFORMED
        tag = (value.get("type") if isinstance(value, dict)
               else value[0] if isinstance(value, list) and value else None)
        if isinstance(tag, str) and tag not in EVENT_TYPES:
            return UNKNOWN_TYPE
        return MALFORMED  # a known tag whose fields do not fit, or no tag at all


def page_runs(events: Iterable[Any]) -> Iterator[tuple[Any, int]]:
    """Stored events of one medium, with chains published a page an event joined: SGLang
    publishes one ``BlockStored`` per page, each naming the page before as its parent, so a
    3,000-token prompt at page size 1 is 3,000 events. Consecutive events that continue the
    one before (its last hash as their parent, the same page size, no LoRA or extra keys) are
    one chain, as vLLM would have sent it: ``(event, how many events it stands for)``. Other
    events pass as they are."""
    run: Any = None
    count = 0
    for event in events:
        if (run is not None and event.parent_block_hash is not None
                and event.parent_block_hash == run.block_hashes[-1]
                and event.block_size == run.block_size and _plain(event)):
            if count == 1:  # a copy of the first: the decoded event stays as it was
                run = _ArrayStored(list(run.block_hashes), run.parent_block_hash,
                                   list(run.token_ids), run.block_size, None, run.medium)
            run.block_hashes.extend(event.block_hashes)
            run.token_ids.extend(event.token_ids)
            count += 1
            continue
        if run is not None:
            yield run, count
        run, count = (event, 1) if _plain(event) else (None, 0)
        if run is None:
            yield event, 1
    if run is not None:
        yield run, count


def _plain(event: Any) -> bool:
    """A stored event with nothing but hashes, tokens and a page size to tell it apart."""
    return (event.lora_id is None and event.lora_name is None and not event.extra_keys
            and bool(event.block_hashes))


def sequence_of(frame: bytes) -> int:
    """The 8-byte big-endian sequence number of a message (unsigned, as vLLM masks it)."""
    if len(frame) != 8:
        raise DecodeError(BAD_SEQUENCE, f"sequence frame of {len(frame)} bytes, not 8")
    return int.from_bytes(frame, "big")


def split_message(frames: list[bytes]) -> tuple[bytes, int, bytes]:
    """``(topic, sequence, payload)`` of a published message; raises DecodeError."""
    if len(frames) != 3:
        raise DecodeError(FRAMES, f"{len(frames)} frame(s), not 3 (topic, sequence, payload)")
    topic, seq, payload = frames
    return topic, sequence_of(seq), payload
