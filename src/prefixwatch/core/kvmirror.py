"""A mirror of each engine's cached blocks, rebuilt from its KV event stream (pure).

Block hashes are seeded per engine process, so two replicas hash the same content differently:
identity here is *content*, the chain of token ids from the root plus the LoRA name and the
block's extra keys (cache_salt, multimodal hashes), rebuilt from ``parent_block_hash`` and
``token_ids``. One ``FleetContent`` per model holds every content block seen (a tree, bounded:
the oldest blocks no replica holds are forgotten first, counted); one ``TargetMirror`` per
engine holds its resident copies by medium and hash, with exact copy counts (vLLM can cache
two physical copies of one content and drop them separately).

Every device block a replica stores and no lower tier of it supplied was computed; it is
classified once, when stored, by why (in tokens, ``block_size`` each):

- ``eviction``: this replica held that content before and removed it;
- ``routing``: otherwise, another replica of the model holds it now (any medium);
- ``layout``: otherwise, the same text as an earlier chain after a short divergence
  (``core.ledger.layout_end_from``, the request ledger's own definition, here on the packed
  words: ``layout_end_packed``);
- ``novel``: the rest.

A device block whose hash a lower tier of the same replica holds is ``loaded`` from that tier,
not computed. Where a new chain leaves the closest known chain is kept as a token position
(a timestamp at token 8 reads 8), with the tokens on both sides so a tokenizer can say what
varies there.
"""

from __future__ import annotations

import bisect
import threading
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from prefixwatch.core import names
from prefixwatch.core.kvevents import EVENT_TYPES, REMOVED_TYPES, STORED_TYPES, Batch
from prefixwatch.core.ledger import LAYOUT_SPAN

DEVICE = "GPU"
#: Why a device block had to be computed (prefixwatch_kv_computed_tokens_total{part}).
COMPUTED_PARTS: tuple[str, ...] = names.KV_COMPUTED_PARTS
#: The tokens around a divergence kept for a tokenizer (each side).
DIVERGENCE_CONTEXT = 24
#: Divergences waiting for a tokenizer, at most.
MAX_PENDING_DIVERGENCES = 256
#: Hashes of removed blocks kept per replica (a later chain may name one as its parent).
RECENT_REMOVED = 65_536


class Block:
    """One content block: its tokens, its place in the chain, and who holds it."""

    __slots__ = ("cid", "parent", "raw", "end", "children", "holders", "evicted")

    def __init__(self, cid: int, parent: Block | None, raw: bytes, end: int) -> None:
        self.cid = cid
        self.parent = parent
        self.raw = raw  # the block's token ids as 4-byte words (b"" for a root)
        self.end = end  # absolute token depth after this block
        self.children: dict[int, Block] = {}
        #: replica id -> resident copies, every medium; no entry at 0.
        self.holders: dict[int, int] = {}
        #: Bit i set: replica i removed a copy of this content.
        self.evicted = 0

    @property
    def edge(self) -> array:
        """The tokens as ``array('I')``, made when asked (the layout search, a divergence):
        the raw words are what identity hashes, and far cheaper to keep."""
        out = array("I")
        out.frombytes(self.raw)
        return out


class FleetContent:
    """The content tree of one model, shared by its replicas' mirrors (one lock)."""

    def __init__(self, model: str, max_blocks: int = names.KV_MAX_CONTENT_BLOCKS) -> None:
        self.model = model
        self.max_blocks = max_blocks
        self.lock = threading.Lock()
        self.blocks: dict[int, Block] = {}  # insertion order: the oldest first
        self.roots: dict[Any, Block] = {}
        self.forgotten = 0  # blocks dropped from the history by the cap
        self._ids = 0

    def root(self, key: Any) -> Block:
        node = self.roots.get(key)
        if node is None:
            node = self.roots[key] = Block(hash(("root", key)), None, b"", 0)
        return node

    def new_replica_id(self) -> int:
        self._ids += 1
        return self._ids - 1

    def trim(self) -> int:
        """Forget the oldest blocks no replica holds until under the cap; returns how many."""
        dropped = 0
        blocks = self.blocks
        budget = len(blocks)  # each block is looked at once at most
        while len(blocks) > self.max_blocks and budget > 0:
            budget -= 1
            cid = next(iter(blocks))
            node = blocks.pop(cid)
            if node.holders:
                blocks[cid] = node  # held: to the back of the line
                continue
            if node.parent is not None:
                node.parent.children.pop(cid, None)
            dropped += 1
        self.forgotten += dropped
        return dropped


@dataclass
class Divergence:
    """Where a new chain left the closest known chain, with the tokens on both sides."""

    position: int
    before: list[int]
    mine: list[int]
    theirs: list[int]
    chain_tokens: int  # the new chain's known length, for the own-content share


@dataclass
class Histogram:
    """Cumulative-on-read bucket counts of one histogram series."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[float, int]]:
        out, run = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            run += count
            out.append((bound, run))
        return out


class TargetMirror:
    """One engine's cached blocks by medium, and what its stream says about them."""

    def __init__(self, fleet: FleetContent, block_size: int = 16,
                 max_resident: int = names.KV_MAX_RESIDENT_BLOCKS) -> None:
        self.fleet = fleet
        self.rid = fleet.new_replica_id()
        self.bit = 1 << self.rid
        self.block_size = block_size
        self.max_resident = max_resident
        #: medium -> block hash -> its content block (None: not known); and the stored ts of
        #: its copies (one float, a list for two or more): no list per block, so no object
        #: per resident block for the cyclic collector to walk.
        self.resident: dict[str, dict[Any, Block | None]] = {}
        self.since: dict[str, dict[Any, Any]] = {}
        self.resident_count: dict[str, int] = {}
        self.stored: dict[str, int] = {}
        self.removed: dict[str, int] = {}
        self.lifetimes: dict[str, Histogram] = {}
        self.events: dict[str, int] = dict.fromkeys(EVENT_TYPES, 0)
        self.errors: dict[str, int] = {}
        self.computed = dict.fromkeys(COMPUTED_PARTS, 0)
        self.loaded: dict[str, int] = {}
        self.divergence = Histogram(names.DIVERGENCE_BUCKETS)
        self.pending: deque[Divergence] = deque(maxlen=MAX_PENDING_DIVERGENCES)
        self._recent: dict[Any, Block] = {}
        self._total = 0  # resident copies, every medium

    # -- feeding -------------------------------------------------------------------------------

    def apply(self, batch: Batch) -> None:
        """Apply one decoded batch (the caller has counted its message)."""
        for reason, n in batch.dropped.items():
            self.count_error(reason, n)
        ts = batch.ts
        removing: list[Any] = []  # consecutive removals of one medium go in one pass
        removing_from = DEVICE
        removed = stored = cleared = 0  # events, counted in bulk (as far as applied)
        store, store_lower = self._store, self._store_lower
        with self.fleet.lock:
            try:
                for event in batch.events:
                    kind = type(event)
                    if kind in REMOVED_TYPES:
                        removed += 1
                        medium = event.medium or DEVICE
                        if removing and medium != removing_from:
                            self._remove(removing, removing_from, ts)
                            removing = []
                        removing_from = medium
                        removing.extend(event.block_hashes)
                        continue
                    if removing:
                        self._remove(removing, removing_from, ts)
                        removing = []
                    if kind in STORED_TYPES:
                        stored += 1
                        medium = event.medium
                        if medium is None or medium == DEVICE:
                            store(event, ts)
                        else:
                            store_lower(event, ts)
                    else:
                        cleared += 1
                        self.clear()
                if removing:
                    self._remove(removing, removing_from, ts)
            finally:
                events = self.events
                events["BlockRemoved"] += removed
                events["BlockStored"] += stored
                events["AllBlocksCleared"] += cleared
            if len(self.fleet.blocks) > self.fleet.max_blocks:
                dropped = self.fleet.trim()
                if dropped:
                    self.count_error(names.KV_ERROR_HISTORY_FULL, dropped)

    def count_error(self, reason: str, n: int = 1) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + n

    def _tier(self, medium: str) -> tuple[dict[Any, Block | None], dict[Any, Any]]:
        """The resident blocks of one medium and their copies' stored times."""
        res = self.resident.get(medium)
        if res is None:
            res = self.resident[medium] = {}
            self.since[medium] = {}
        return res, self.since[medium]

    def _lookup(self, h: Any) -> Block | None:
        for per in self.resident.values():
            node = per.get(h)
            if node is not None:
                return node
        return self._recent.get(h)

    def _store(self, ev: Any, ts: float) -> None:
        """A device store: residency, content, and why each block had to be computed (or
        which lower tier of this replica supplied it)."""
        hashes = ev.block_hashes
        n = len(hashes)
        if not n:
            return
        medium = DEVICE
        bs = ev.block_size or self.block_size
        self.block_size = bs
        toks = ev.token_ids
        if toks and len(toks) != n * bs:
            self.count_error(names.KV_ERROR_TOKENS)
            toks = []
        fleet = self.fleet
        if ev.parent_block_hash is None:
            parent: Block | None = fleet.root(ev.lora_name)
        else:
            parent = self._lookup(ev.parent_block_hash)
            if parent is None and toks:
                self.count_error(names.KV_ERROR_UNKNOWN_PARENT)
                parent = fleet.root(("unknown parent", ev.lora_name, ev.parent_block_hash))
        resident = self.resident
        lower = [(m, per) for m, per in resident.items() if m != DEVICE and per]
        res, since = self._tier(medium)
        blocks = fleet.blocks
        blocks_get = blocks.get
        rid, bit = self.rid, self.bit
        chain: list[Block | None] = []
        keep = chain.append
        created_at = -1
        room = self.max_resident - self._total
        stored_here = 0
        evicted = routed = novel = 0
        with_tokens = bool(toks) and parent is not None
        width = 4 * bs
        words = b""
        if with_tokens:
            words = array("I", toks).tobytes()
            parts: list[bytes] = [words[o:o + width] for o in range(0, n * width, width)]
            keys = _keys(ev.extra_keys, n)
        lookup = self._lookup
        loaded = self.loaded
        node: Block | None
        for i in range(n):
            h = hashes[i]
            if with_tokens:
                part = parts[i]
                cid = hash((parent.cid, keys[i] if keys else None, part))  # type: ignore
                node = blocks_get(cid)
                if node is None:
                    node = Block(cid, parent, part, parent.end + bs)  # type: ignore[union-attr]
                    blocks[cid] = node
                    parent.children[cid] = node  # type: ignore[union-attr]
                    if created_at < 0:
                        created_at = i
            else:
                node = lookup(h)  # a lower tier's block without tokens: join by hash
            # What this copy is, before it counts as held.
            source = None
            if lower:
                for m, per in lower:
                    if h in per:
                        source = m
                        break
            if node is None:
                mine = 0
                if source is not None:
                    loaded[source] = loaded.get(source, 0) + bs
                else:
                    novel += 1
                keep(None)
            else:
                holders = node.holders
                mine = holders.get(rid, 0)
                if source is not None:
                    loaded[source] = loaded.get(source, 0) + bs
                    keep(None)
                elif node.evicted & bit:
                    evicted += 1
                    keep(None)
                elif len(holders) > (mine > 0):
                    routed += 1
                    keep(None)
                else:
                    keep(node)  # layout or novel: decided below
            # _hold, inline: the device store's loop is the ingest's hottest (a call per block
            # costs about 4% of the benchmark), and the holder count is already read.
            if h not in res:
                if stored_here >= room:
                    self.count_error(names.KV_ERROR_MIRROR_FULL, n - i)
                    break
                res[h] = node
                since[h] = ts
            else:
                if res[h] is None:
                    res[h] = node
                _one_more(since, h, ts)
            if node is not None:
                holders[rid] = mine + 1
            stored_here += 1
            parent = node
        computed = self.computed
        computed["novel"] += novel * bs
        computed["eviction"] += evicted * bs
        computed["routing"] += routed * bs
        self.stored[medium] = self.stored.get(medium, 0) + n
        self.resident_count[medium] = self.resident_count.get(medium, 0) + stored_here
        self._total += stored_here
        if chain:
            self._classify(chain, created_at, toks, words, bs)

    def _store_lower(self, ev: Any, ts: float) -> None:
        """A lower tier's store (CPU, disk, ...): residency and content, no classification."""
        hashes = ev.block_hashes
        medium = ev.medium
        bs = ev.block_size or self.block_size
        toks = ev.token_ids
        n = len(hashes)
        if toks and len(toks) != n * bs:
            self.count_error(names.KV_ERROR_TOKENS)
            toks = []
        res, since = self._tier(medium)
        self.stored[medium] = self.stored.get(medium, 0) + n
        blocks, rid, extra = self.fleet.blocks, self.rid, ev.extra_keys
        room = self.max_resident - self._total
        held = 0
        words = b""
        width = 4 * bs
        tiers = self.resident.values()
        recent_get = self._recent.get
        node: Block | None = None
        for i in range(n):
            h = hashes[i]
            # The engine's own hash: a block it holds (on the device, mostly: the tier copies
            # what the device computed) is that content, with no token to pack (_lookup).
            prev = node
            for per in tiers:
                node = per.get(h)
                if node is not None:
                    break
            else:
                node = recent_get(h)
            if node is None and toks:
                parent = prev if i else self._lower_parent(ev)
                if not words:
                    words = array("I", toks).tobytes()
                part = words[i * width:(i + 1) * width]
                key = _freeze(extra[i]) if extra and i < len(extra) and extra[i] is not None \
                    else None
                cid = hash((parent.cid, key, part))
                node = blocks.get(cid)
                if node is None:
                    node = blocks[cid] = Block(cid, parent, part, parent.end + bs)
                    parent.children[cid] = node
            if not _hold(res, since, h, node, ts, rid, held < room):
                self.count_error(names.KV_ERROR_MIRROR_FULL, n - i)
                break
            held += 1
        self.resident_count[medium] = self.resident_count.get(medium, 0) + held
        self._total += held

    def _lower_parent(self, ev: Any) -> Block:
        """The block before a lower tier's event (a placeholder root, counted, if unknown)."""
        ph = ev.parent_block_hash
        parent = self.fleet.root(ev.lora_name) if ph is None else self._lookup(ph)
        if parent is None:
            self.count_error(names.KV_ERROR_UNKNOWN_PARENT)
            parent = self.fleet.root(("unknown parent", ev.lora_name, ph))
        return parent

    def _classify(self, chain: list[Block | None], created_at: int, toks: Sequence[int],
                  words: bytes, bs: int) -> None:
        """Layout or novel for the computed blocks no other part claimed."""
        computed = self.computed
        layout_until = -1  # blocks of the chain before this index are layout
        if created_at >= 0:
            new = chain[created_at]  # None: loaded, whatever its content
            start = self._divergence(new, created_at, toks, bs) if new is not None else None
            if start is not None:
                first, j, depth = start
                end = layout_end_packed(words[created_at * 4 * bs:], j, first, depth, bs)
                if end:
                    layout_until = created_at + end // bs
        kept = len(chain) - chain.count(None)
        layout = 0
        if layout_until > created_at >= 0:
            span = chain[created_at:layout_until]
            layout = len(span) - span.count(None)
        computed["layout"] += layout * bs
        computed["novel"] += (kept - layout) * bs

    def _divergence(self, new: Block, at: int, toks: Sequence[int], bs: int
                    ) -> tuple[Block, int, int] | None:
        """Observe where the chain that creates ``new`` leaves the closest known chain; returns
        (the sibling's first block, the offset in ``new``, the absolute depth) for layout."""
        parent = new.parent
        assert parent is not None
        sibling = None
        for child in reversed(parent.children.values()):
            if child is not new:
                sibling = child
                break
        if sibling is None:
            if parent.parent is not None:  # extends a known chain at its end
                self.divergence.observe(parent.end)
            return None
        mine, theirs = new.edge, sibling.edge
        j = 0
        while j < bs and mine[j] == theirs[j]:
            j += 1
        position = parent.end + j
        self.divergence.observe(position)
        lo = at * bs + j
        self.pending.append(Divergence(
            position, list(toks[max(0, lo - DIVERGENCE_CONTEXT):lo]),
            list(toks[lo:lo + DIVERGENCE_CONTEXT]),
            _path_tokens(sibling, j, DIVERGENCE_CONTEXT), parent.end + len(toks) - at * bs))
        return sibling, j, parent.end + j

    def _remove(self, hashes: Sequence[Any], medium: str, ts: float) -> None:
        res = self.resident.get(medium) or {}
        since = self.since.get(medium) or {}
        rid, bit = self.rid, self.bit
        hist = self.lifetimes.get(medium)
        if hist is None:
            hist = self.lifetimes[medium] = Histogram(names.KV_LIFETIME_BUCKETS)
        bounds, counts = hist.bounds, hist.counts
        recent = self._recent
        bucket = bisect.bisect_left
        unknown = 0
        total_age = 0.0
        for h in hashes:
            copies = since.get(h)
            if copies is None:
                unknown += 1
                continue
            node = res[h]
            if type(copies) is list:  # the oldest copy: which one went is not said
                age = ts - copies.pop(0)
                if len(copies) == 1:
                    since[h] = copies[0]
            else:
                age = ts - copies
                del res[h], since[h]
                if node is not None:
                    recent[h] = node
            age = age if age > 0.0 else 0.0
            counts[bucket(bounds, age)] += 1
            total_age += age
            if node is not None:
                holders = node.holders
                left = holders[rid] - 1
                if left:
                    holders[rid] = left
                else:
                    del holders[rid]
                node.evicted |= bit
        gone = len(hashes) - unknown
        hist.total += total_age
        hist.n += gone
        if gone:
            self.resident_count[medium] -= gone
            self._total -= gone
        if unknown:
            self.count_error(names.KV_ERROR_UNKNOWN_BLOCK, unknown)
        while len(recent) > RECENT_REMOVED:
            del recent[next(iter(recent))]
        self.removed[medium] = self.removed.get(medium, 0) + len(hashes)

    def clear(self) -> None:
        """Every resident copy is gone (AllBlocksCleared, a restarted publisher); the content
        stays known, and the loss is not an eviction."""
        rid = self.rid
        for per in self.resident.values():
            for node in per.values():
                if node is not None:
                    node.holders.pop(rid, None)
        self.resident.clear()
        self.since.clear()
        self.resident_count = dict.fromkeys(self.resident_count, 0)
        self._total = 0
        self._recent.clear()

    # -- reading -------------------------------------------------------------------------------

    def snapshot(self) -> MirrorSnapshot:
        """A copy of the counters, taken under the fleet's lock, for one scrape."""
        with self.fleet.lock:
            return MirrorSnapshot(
                model=self.fleet.model, block_size=self.block_size,
                events=dict(self.events), errors=dict(self.errors),
                stored=dict(self.stored), removed=dict(self.removed),
                resident=dict(self.resident_count),
                lifetimes={m: (h.cumulative(), h.total) for m, h in self.lifetimes.items()},
                computed=dict(self.computed), loaded=dict(self.loaded),
                divergence=(self.divergence.cumulative(), self.divergence.total))

    def take_divergences(self) -> list[Divergence]:
        with self.fleet.lock:
            out = list(self.pending)
            self.pending.clear()
        return out


@dataclass(frozen=True)
class MirrorSnapshot:
    model: str
    block_size: int
    events: dict[str, int]
    errors: dict[str, int]
    stored: dict[str, int]
    removed: dict[str, int]
    resident: dict[str, int]
    lifetimes: dict[str, tuple[list[tuple[float, int]], float]]
    computed: dict[str, int]
    loaded: dict[str, int]
    divergence: tuple[list[tuple[float, int]], float]

    @property
    def computed_tokens(self) -> int:
        return sum(self.computed.values())




def _hold(res: dict[Any, Block | None], since: dict[Any, Any], h: Any, node: Block | None,
          ts: float, rid: int, room: bool) -> bool:
    """One more resident copy of block ``h`` (and of its content, for replica ``rid``);
    False when it is a new hash and there is no ``room``. (A device store does the same
    inline, with the holder count it has already read.)"""
    if h not in res:
        if not room:
            return False
        res[h] = node
        since[h] = ts
    else:
        if res[h] is None:
            res[h] = node
        _one_more(since, h, ts)
    if node is not None:
        node.holders[rid] = node.holders.get(rid, 0) + 1
    return True


def _one_more(since: dict[Any, Any], h: Any, ts: float) -> None:
    """One more copy of a resident hash stored at ``ts`` (rare: vLLM's duplicate blocks)."""
    copies = since[h]
    if type(copies) is list:
        copies.append(ts)
    else:
        since[h] = [copies, ts]


def _path_tokens(node: Block, skip: int, want: int) -> list[int]:
    """Up to ``want`` tokens along the most recent path from ``node``, after ``skip``."""
    out: list[int] = []
    while node is not None and len(out) < want:
        out.extend(node.edge[skip:skip + want - len(out)])
        skip = 0
        node = next(reversed(node.children.values()), None) if node.children else None
    return out


def _keys(extra: list[Any] | None, n: int) -> list[Any] | None:
    """The identity key of each of ``n`` blocks from an event's extra keys (None: none)."""
    if not extra:
        return None
    keys = [None if x is None else _freeze(x) for x in extra[:n]]
    keys.extend([None] * (n - len(keys)))
    return keys


def _freeze(value: Any) -> Any:
    """An extra key as a hashable value (msgpack gives lists)."""
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    return value


# -- The layout search on packed words ----------------------------------------------------------
# ``core.ledger.layout_end_from`` with the query and the blocks' edges as 4-byte words: the same
# result (the tests compare both), without an ``array`` per block along the sibling path.


def layout_end_packed(words: bytes, d: int, first: Block, depth: int, bs: int) -> int:
    """``layout_end_from(q, d, first, depth, bs)`` for ``q`` packed as ``words``."""
    n = len(words) >> 2
    if n - d < bs + 1:
        return 0
    skip = depth - (first.end - (len(first.raw) >> 2))
    head = _head_words(first, skip + LAYOUT_SPAN + bs)[4 * skip:]
    if len(head) < 4 * bs:
        return 0
    mine = array("I")
    mine.frombytes(words[4 * d:4 * (d + LAYOUT_SPAN + bs)])
    starts = mine[:LAYOUT_SPAN + 1]
    theirs = array("I")
    theirs.frombytes(head)
    seen = set(theirs)  # a block can only start on a token the sibling has: most never do
    if seen.isdisjoint(starts):
        return 0
    for s in [s for s, t in enumerate(starts) if t in seen]:
        if s + bs > len(mine):
            break
        needle = words[4 * (d + s):4 * (d + s + bs)]
        at = head.find(needle)
        while at != -1 and at % 4:
            at = head.find(needle, at + 1)
        if at == -1 or at // 4 > LAYOUT_SPAN:
            continue
        return d + s + bs + _run_words(words, d + s + bs, first, depth + at // 4 + bs)
    return 0


def _head_words(node: Block, want: int) -> bytes:
    """The first ``want`` tokens (as words) of the sibling path from ``node``."""
    out = b""
    while True:
        out += node.raw[:4 * want - len(out)]
        if len(out) >= 4 * want or not node.children:
            return out
        node = next(reversed(node.children.values()))


def _run_words(words: bytes, i: int, node: Block, depth: int) -> int:
    """The common run (in tokens) of ``words`` from token ``i`` and the sibling path from
    ``node`` (most recent children) read from absolute ``depth`` on, block by block."""
    while depth >= node.end:  # down to the block that holds ``depth``
        if not node.children:
            return 0
        node = next(reversed(node.children.values()))
    run, n = 0, len(words) >> 2
    while i < n:
        raw = node.raw
        size = len(raw) >> 2
        off = depth - (node.end - size)
        m = min(n - i, size - off)
        k = 0
        if m > 0:
            a, b = words[4 * i:4 * (i + m)], raw[4 * off:4 * (off + m)]
            if a == b:
                k = m
            else:
                while a[4 * k:4 * k + 4] == b[4 * k:4 * k + 4]:
                    k += 1
        run, i, depth = run + k, i + k, depth + k
        if depth < node.end or not node.children:
            return run  # a difference inside this block, or the sibling ends
        node = next(reversed(node.children.values()))
    return run
