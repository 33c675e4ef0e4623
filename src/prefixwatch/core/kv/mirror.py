"""A mirror of each engine's cached blocks, rebuilt from its KV event stream (pure).

One ``FleetContent`` per model (``core/kv/content.py``) holds every content block seen; one
``TargetMirror`` per engine holds its resident copies by medium and hash (``core/kv/residency.py``)
and counts why each computed block was computed (``core/kv/parts.py``).

A batch is applied a run of events at a time: consecutive removals of one medium in one pass,
consecutive stores of one lower tier (vLLM's offload connector sends one block per event) in
one pass, each device store as a whole. Within a run the work is bulk dictionary and set
operations over its blocks; the per-block Python left is the content id of a device block
(one tuple hash; none for a known block along the path its chain follows, matched by its
bytes) and a ``Block`` for content never seen before.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain, groupby
from operator import attrgetter
from typing import Any

from prefixwatch.core.kv.codec import (
    EVENT_TYPES,
    REMOVED_TYPES,
    STORED_TYPES,
    Batch,
    page_runs,
)
from prefixwatch.core.kv.content import (
    Block,
    FleetContent,
    block_keys,
    content_id,
    content_ids,
    freeze,
    pack,
    split_words,
)
from prefixwatch.core.kv.counts import Divergence, MirrorSnapshot
from prefixwatch.core.kv.parts import COMPUTED_PARTS, ComputedParts
from prefixwatch.core.kv.residency import RECENT_REMOVED, Residency
from prefixwatch.core.kv.whatif import WhatIf
from prefixwatch.core.vocab import exposition

DEVICE = "GPU"
__all__ = ["COMPUTED_PARTS", "DEVICE", "Divergence", "FleetContent", "MirrorSnapshot",
           "TargetMirror"]

_medium = attrgetter("medium")
_hashes = attrgetter("block_hashes")
_tokens = attrgetter("token_ids")
_block_size = attrgetter("block_size")


def _removal_medium(event: Any) -> str:
    return event.medium or DEVICE


class TargetMirror:
    """One engine's cached blocks by medium, and what its stream says about them."""

    def __init__(self, fleet: FleetContent, block_size: int = 16,
                 max_resident: int = exposition.KV_MAX_RESIDENT_BLOCKS) -> None:
        self.fleet = fleet
        self.rid, held, evicted = fleet.new_replica()
        self.block_size = block_size
        self.max_resident = max_resident
        self.copies = Residency(held, evicted)
        self.parts = ComputedParts()
        self.stored: dict[str, int] = {}
        self.removed: dict[str, int] = {}
        self.events: dict[str, int] = dict.fromkeys(EVENT_TYPES, 0)
        self.errors: dict[str, int] = {}
        #: Recompute distances: the hit ratio of a larger pool (core/kv/whatif.py).
        self.whatif = WhatIf()

    # -- feeding -------------------------------------------------------------------------------

    def apply(self, batch: Batch) -> None:
        """Apply one decoded batch (the caller has counted its message)."""
        for reason, n in batch.dropped.items():
            self.count_error(reason, n)
        ts = batch.ts
        events = self.events
        with self.fleet.lock:
            for kind, group in groupby(batch.events, type):
                if kind in REMOVED_TYPES:
                    run = list(group)
                    events["BlockRemoved"] += len(run)
                    self._remove_run(run, ts)
                elif kind in STORED_TYPES:
                    for medium, same in groupby(group, _medium):
                        if medium is None or medium == DEVICE:
                            for event, n in page_runs(same):  # SGLang's pages as chains
                                events["BlockStored"] += n
                                self._store(event, ts)
                        else:
                            self._store_lower_run(list(same), ts)
                else:
                    for _event in group:
                        events["AllBlocksCleared"] += 1
                        self.clear()
            if len(self.fleet.blocks) > self.fleet.max_blocks:
                dropped = self.fleet.trim()
                if dropped:
                    self.count_error(exposition.KV_ERROR_HISTORY_FULL, dropped)
            if len(self.copies.evicted) > 2 * (self.fleet.max_blocks + RECENT_REMOVED):
                self.fleet.prune_evicted(self.copies.evicted)  # bounded, whatever comes

    def count_error(self, reason: str, n: int = 1) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + n

    def _remove_run(self, run: list[Any], ts: float) -> None:
        """Consecutive removals: one pass per medium they name in turn."""
        media = list(map(_medium, run))
        if media.count(media[0]) == len(media):
            self._remove(list(chain.from_iterable(map(_hashes, run))), media[0] or DEVICE, ts)
            return
        for medium, same in groupby(run, _removal_medium):
            self._remove(list(chain.from_iterable(map(_hashes, same))), medium, ts)

    def _remove(self, hashes: Sequence[Any], medium: str, ts: float) -> None:
        unknown = self.copies.remove(hashes, medium, ts)
        if unknown:
            self.count_error(exposition.KV_ERROR_UNKNOWN_BLOCK, unknown)
        if medium == DEVICE:
            self.whatif.removed(self.copies.released)
        self.removed[medium] = self.removed.get(medium, 0) + len(hashes)

    def _parent(self, ev: Any, with_tokens: bool) -> Block | None:
        """The block before an event's first (a placeholder root, counted, when the event has
        tokens but its parent was never seen; None when it has none)."""
        ph = ev.parent_block_hash
        if ph is None:
            return self.fleet.root(ev.lora_name)
        parent = self.copies.lookup(ph)
        if parent is None and with_tokens:
            self.count_error(exposition.KV_ERROR_UNKNOWN_PARENT)
            parent = self.fleet.root(("unknown parent", ev.lora_name, ph))
            self.fleet.placeholder_roots.add(parent.cid)
        return parent

    def _tokens(self, ev: Any, n: int, bs: int) -> Sequence[int]:
        """The event's token ids, or none when they are not one block per hash (counted)."""
        toks = ev.token_ids
        if toks and len(toks) != n * bs:
            self.count_error(exposition.KV_ERROR_TOKENS)
            return []
        return toks

    def _store(self, ev: Any, ts: float) -> None:
        """A device store: residency, content, and why each block had to be computed (or
        which lower tier of this replica supplied it)."""
        hashes = ev.block_hashes
        n = len(hashes)
        if not n:
            return
        bs = ev.block_size or self.block_size
        self.block_size = bs
        toks = self._tokens(ev, n, bs)
        parent = self._parent(ev, bool(toks))
        copies, fleet = self.copies, self.fleet
        lower = [(m, per) for m, per in copies.resident.items() if m != DEVICE and per]
        fits = copies.room(self.max_resident, DEVICE, hashes)
        if fits < n:
            self.count_error(exposition.KV_ERROR_MIRROR_FULL, n - fits)
            hashes = hashes[:fits + 1]  # the block that found no room is still classified
        created_at = -1
        known = len(hashes)  # the blocks before this index may be held or evicted
        words = b""
        sibling = None
        if toks and parent is not None:
            words = pack(toks)
            width, m = 4 * bs, len(hashes)
            keys = block_keys(ev.extra_keys, m)
            if keys is not None:
                fleet.keyed = True
            # The known blocks the chain starts with (most of them along a path: no hash),
            # then the rest by content id (each from the one before), made when not known.
            nodes: list[Any] = fleet.known_prefix(parent, words, m, width)  # [] when keyed
            k = len(nodes)
            if k < m:
                prev = nodes[-1] if k else parent
                parts = split_words(words if not k and m == n else words[k * width:m * width],
                                    width)
                cids = content_ids(prev.cid, parts, keys)
                rest = list(map(fleet.blocks.get, cids))
                if not all(rest):  # (a Block is always true: faster than ``None in rest``)
                    start = rest.index(None)
                    created_at = k + start
                    if rest.count(None) == len(rest) - start:
                        known = created_at  # the rest is new: the usual end of a chain
                    sibling = fleet.extend(prev, cids, parts, rest, start)
                nodes += rest
        else:
            nodes = copies.lookup_many(hashes)  # no tokens: content known by hash, or not
        found = self.parts.claim(nodes, hashes, lower, copies.evicted, fleet.others(self.rid),
                                 bs, known)
        if fits < n:
            hashes, nodes = hashes[:fits], nodes[:fits]
        copies.hold(DEVICE, hashes, nodes, ts)
        self.stored[DEVICE] = self.stored.get(DEVICE, 0) + n
        parts = self.parts
        self.whatif.stored(parent, nodes[-1] if nodes else None, n, parts.reused,
                           parts.source, bs)
        parts.layout(found, created_at, toks, words, bs, sibling)

    def _store_lower_run(self, run: list[Any], ts: float) -> None:
        """Consecutive stores of one lower tier (CPU, disk, ...): residency and content, no
        classification. Their blocks are the device's, mostly: joined by the engine's hash,
        in one pass when every one is known and there is room."""
        copies = self.copies
        per_event = list(map(_hashes, run))
        hashes = list(chain.from_iterable(per_event))
        nodes = copies.lookup_many(hashes)
        if not all(nodes) or len(hashes) > self.max_resident - copies.total:
            for ev in run:
                self.events["BlockStored"] += 1
                self._store_lower(ev, ts)
            return
        self.events["BlockStored"] += len(run)
        self._check_tokens(run, per_event, len(hashes))
        medium = run[0].medium
        self.stored[medium] = self.stored.get(medium, 0) + len(hashes)
        copies.hold(medium, hashes, nodes, ts)

    def _check_tokens(self, run: list[Any], per_event: list[Any], n: int) -> None:
        """Count the events of a run whose token ids are not one block per hash (``n``
        hashes in all)."""
        sizes = set(map(_block_size, run))
        if len(sizes) == 1 and n == len(run) and all(per_event):
            bs = next(iter(sizes)) or self.block_size
            if set(map(len, map(_tokens, run))) <= {0, bs}:
                return  # one block per event, none or one block of tokens each: the offload's
        bad = sum(1 for ev, hashes in zip(run, per_event, strict=True)
                  if ev.token_ids and len(ev.token_ids)
                  != len(hashes) * (ev.block_size or self.block_size))
        if bad:
            self.count_error(exposition.KV_ERROR_TOKENS, bad)

    def _store_lower(self, ev: Any, ts: float) -> None:
        """One lower tier's store, a block at a time (content made from its tokens)."""
        hashes = ev.block_hashes
        medium = ev.medium
        bs = ev.block_size or self.block_size
        n = len(hashes)
        toks = self._tokens(ev, n, bs)
        copies, fleet = self.copies, self.fleet
        res, since = copies.tier(medium)
        self.stored[medium] = self.stored.get(medium, 0) + n
        fits = copies.room(self.max_resident, medium, hashes)
        if fits < n:
            self.count_error(exposition.KV_ERROR_MIRROR_FULL, n - fits)
        extra = ev.extra_keys
        words = pack(toks) if toks else b""
        width = 4 * bs
        node: Block | None = None
        for i in range(min(fits + 1, n)):
            h = hashes[i]
            # The engine's own hash: a block it holds (on the device, mostly: the tier copies
            # what the device computed) is that content, with no token to pack.
            prev = node
            node = copies.lookup(h)
            if node is None and toks:
                parent = prev if i else self._parent(ev, True)
                assert parent is not None
                part = words[i * width:(i + 1) * width]
                key = freeze(extra[i]) if extra and i < len(extra) and extra[i] is not None \
                    else None
                if key is not None:
                    fleet.keyed = True
                node = fleet.child(parent, content_id(parent.cid, key, part), part)
            if i < fits:
                copies.hold_one(medium, res, since, h, node, ts)
        held = min(fits, n)
        copies.count[medium] = copies.count.get(medium, 0) + held
        copies.total += held

    def clear(self) -> None:
        """Every resident copy is gone (AllBlocksCleared, a restarted publisher); the content
        stays known, and the loss is not an eviction."""
        self.copies.clear()
        self.whatif.clear()

    # -- reading -------------------------------------------------------------------------------

    @property
    def computed(self) -> dict[str, int]:
        """Computed tokens by part (read under the fleet's lock, or take a snapshot)."""
        return self.parts.computed

    @property
    def loaded(self) -> dict[str, int]:
        """Loaded tokens by the lower tier that supplied them."""
        return self.parts.loaded

    def snapshot(self) -> MirrorSnapshot:
        """A copy of the counters, taken under the fleet's lock, for one scrape."""
        parts, copies, whatif = self.parts, self.copies, self.whatif
        with self.fleet.lock:
            errors = dict(self.errors)
            if whatif.dropped:
                errors[exposition.KV_ERROR_GHOSTS_FULL] = whatif.dropped
            return MirrorSnapshot(
                model=self.fleet.model, block_size=self.block_size,
                events=dict(self.events), errors=errors,
                stored=dict(self.stored), removed=dict(self.removed),
                resident=dict(copies.count),
                lifetimes={m: (h.cumulative(), h.total) for m, h in copies.lifetimes.items()},
                computed=dict(parts.computed), loaded=dict(parts.loaded),
                divergence=(parts.divergence.cumulative(), parts.divergence.total),
                pool_blocks=whatif.pool_blocks, whatif=whatif.gained_tokens())

    def take_divergences(self) -> list[Divergence]:
        """The divergences waiting to be named, the oldest first (and no longer waiting)."""
        with self.fleet.lock:
            out = list(self.parts.pending)
            self.parts.pending.clear()
        return out

    def take_dropped_divergences(self) -> int:
        """How many divergences a full queue dropped unnamed since last asked."""
        with self.fleet.lock:
            dropped, self.parts.pending_dropped = self.parts.pending_dropped, 0
        return dropped

