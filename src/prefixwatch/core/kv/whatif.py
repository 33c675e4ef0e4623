"""How much memory would win it back: one replica's recompute distances, from its stream (pure).

vLLM keeps every free block in one queue (``kv_cache_utils.FreeKVCacheBlockQueue``):
``BlockPool.free_blocks`` appends a finished request's cached blocks at the tail (its chain
reversed, so a prompt's last blocks sit nearest the head) and prepends blocks that cache
nothing at the head; ``get_new_blocks`` pops the head, and a popped block that caches content
is evicted there (``_maybe_evict_cached_block``: that is the ``BlockRemoved`` event); a hit on a
free cached block takes it out of the queue (``touch``).

Run the same schedule on a pool ``E`` blocks larger. Its queue is this pool's queue with ``E``
more cached blocks just behind the hashless ones at the head: the ``E`` this pool evicted last,
in the order it evicted them (the *ghosts*). A pop that takes a hashless block takes the same
one in both pools; a pop that evicts here evicts the oldest ghost there, and what it evicted
here becomes the newest ghost. So the content this replica evicted at removal number ``a``
stays cached in the larger pool until ``E`` more device removals, and a request that asks for
it after ``D`` removals (the replica stores it again: the ``eviction`` part) would have hit
in every pool with ``E > D``. The clock is the replica's device removals, which the stream
counts exactly (no allocation is guessed); ``D`` is taken at the replica's previous device
store, before the removals its own allocation makes.

A hit there allocates nothing: the request took a ghost out of that queue instead of evicting
here, so a ghost evicted before the one it took moves one place nearer the head either way, and
a ghost evicted after it does not move. Per scale, the ghosts each pool served are kept (their
removal clocks, sorted), and a ghost's depth in that pool is the removals since its own less
the served ghosts evicted after it: on a schedule that runs one request at a time this is the
larger pool's queue exactly (the simulator's tests measure it within 0.2 points of a run at
that size).

What is not exact: a larger pool runs more requests at once and preempts fewer (a changed
schedule), vLLM always recomputes a prompt's last token (a prompt that would hit whole loses its
last block), and answers' blocks stored again are computed in any pool (a one-block store that
continues the replica's previous store is taken as a decode step and never gains). The stream
itself must be whole: lost messages and a stream followed from mid-way lose ghosts (no gain is
invented). Ghosts the largest pool would have evicted are forgotten in one pass whenever the
ghosts have doubled since the last (at least ``MIN_REBUILD`` removals apart), and their number is
capped (``exposition.KV_MAX_GHOST_BLOCKS``; one dropped while still within reach is counted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sortedcontainers import SortedList

from prefixwatch.core.kv.content import Block
from prefixwatch.core.vocab import exposition

#: The pool scales of the what-if counter (``pool_scale`` label values), and as numbers.
POOL_SCALES: tuple[str, ...] = exposition.KV_WHATIF_POOL_SCALES
_FACTORS: tuple[float, ...] = tuple(float(s) for s in POOL_SCALES)
#: Tips (the last block of a recent device store) remembered to tell a decode step's one-block
#: store from a prompt's: past this many, forgotten all at once.
MAX_TIPS = 4096
#: Ghosts forgotten past the pools' reach no more often than every this many removals.
MIN_REBUILD = 4096
#: Stores kept to count once the pool size is known (the first poll's wait), at most.
MAX_PENDING = 4096


class WhatIf:
    """One replica's ghosts (content it evicted -> its device-removal clock then) and the
    prompt tokens each larger pool would have served from them."""

    def __init__(self, max_ghosts: int = exposition.KV_MAX_GHOST_BLOCKS) -> None:
        self.max_ghosts = max_ghosts
        self.pool_blocks: int | None = None
        #: Device removals so far, and at the end of the previous device store.
        self.clock = 0
        self.at_store = 0
        self.ghosts: dict[Block, int] = {}
        #: The size at which the ghosts past every pool's reach are forgotten (``_forget``;
        #: at ``max_ghosts`` at the latest).
        self._limit = MIN_REBUILD
        #: Per scale, the removal clocks of the ghosts that pool served (sorted): each is a
        #: ghost that left that pool's queue by a hit, not by an eviction.
        self._served: list[SortedList] = [SortedList() for _ in POOL_SCALES]
        self._tips: dict[Block, None] = {}
        #: Prompt tokens served from ghosts, per scale (``POOL_SCALES``' order).
        self.gained: list[int] = [0] * len(POOL_SCALES)
        self.dropped = 0  # ghosts forgotten at the cap while still within reach
        #: Stores stored again before the pool size was known: (clock, ghosts' clocks, bs).
        self._pending: list[tuple[int, list[int], int]] = []

    def set_pool(self, blocks: int | None) -> None:
        """The device pool in blocks (``num_gpu_blocks``); None or below 1: not known. The
        stores seen before it was known are counted now (the stream's first messages arrive
        before the exporter's next poll reads the page)."""
        self.pool_blocks = blocks if blocks and blocks > 0 else None
        if self.pool_blocks is not None and self._pending:
            pending, self._pending = self._pending, []
            for at, evicted, bs in pending:
                self._count(at, evicted, bs)

    def _extra(self, k: int) -> float | None:
        pool = self.pool_blocks
        return None if pool is None else (_FACTORS[k] - 1.0) * pool

    def depth(self, k: int, evicted_at: int, now: int) -> int:
        """How many ghosts evicted after ``evicted_at`` scale ``k``'s pool still holds at
        ``now``: the removals since, less those of them its hits took out of its queue (a
        ghost evicted at ``evicted_at`` is a hit there while this is under the extra
        blocks)."""
        served = self._served[k]
        return now - evicted_at - (len(served) - served.bisect_right(evicted_at))

    # -- feeding (under the fleet's lock) ------------------------------------------------------

    def removed(self, nodes: Sequence[Block]) -> None:
        """Device copies of ``nodes`` were evicted, in the order the engine popped them."""
        n = len(nodes)
        if not n:
            return
        start = self.clock
        ghosts = self.ghosts
        ghosts.update(zip(nodes, range(start, start + n), strict=True))
        self.clock = start + n
        if len(ghosts) > self._limit or len(ghosts) > self.max_ghosts:
            self._forget()

    def _forget(self) -> None:
        """Keep the ghosts the largest pool may still hold, at most half the cap (the newest;
        one dropped while within reach is counted): one pass over the dict, when it has
        grown to twice what it must keep, so a removal pays a constant share of it and keeps
        no object per run for the cyclic collector to walk."""
        ghosts, clock = self.ghosts, self.clock
        last = len(POOL_SCALES) - 1
        reach = self._extra(last)
        keep = self.max_ghosts // 2
        # A ghost's depth in a pool is at least its removals since less every ghost that
        # pool served: past the largest pool's reach by that much, it is gone there.
        horizon = (clock - int(reach) - len(self._served[last]) if reach is not None
                   else clock - keep)
        newest = clock - keep
        if horizon < newest:
            within = sum(1 for c in ghosts.values() if horizon < c <= newest)
            self.dropped += within if reach is not None else 0
            horizon = newest
        self.ghosts = {node: c for node, c in ghosts.items() if c > horizon}
        for served in self._served:
            cut = served.bisect_right(horizon)
            if cut:
                del served[:cut]
        self._limit = max(2 * len(self.ghosts), MIN_REBUILD)

    def stored(self, parent: Block | None, last: Block | None, n: int,
               reused: Sequence[tuple[int, Block]] | None, loaded: Sequence[Any] | None,
               bs: int) -> None:
        """A device store of ``n`` blocks after ``parent`` ending at ``last``; ``reused``: its
        blocks this replica had evicted (position, content), in order; ``loaded``: per
        position, the lower tier that supplied the block (None: none did)."""
        tips = self._tips
        decode = n == 1 and parent is not None and parent in tips
        if len(tips) >= MAX_TIPS:
            tips.clear()
        if last is not None:
            tips[last] = None
        at = self.at_store
        self.at_store = self.clock
        if reused and not decode:
            self._gain(reused, loaded, at, bs)

    def _gain(self, reused: Sequence[tuple[int, Block]], loaded: Sequence[Any] | None,
              at: int, bs: int) -> None:
        """Count, per scale, the leading blocks of a store a larger pool would have served
        (a prompt's cached run stops at its first block not cached), looked up as the
        request was, before its own allocation."""
        ghosts = self.ghosts
        evicted: list[int] = []
        want = 0
        for pos, node in reused:
            while loaded is not None and want < pos and loaded[want] is not None:
                want += 1  # a lower tier's block: cached in any pool
            evicted_at = ghosts.pop(node, None)
            if pos != want or evicted_at is None:
                break
            evicted.append(evicted_at)
            want += 1
        if not evicted:
            return
        if self.pool_blocks is None:
            if len(self._pending) < MAX_PENDING:
                self._pending.append((at, evicted, bs))
            return
        self._count(at, evicted, bs)

    def _count(self, at: int, evicted: list[int], bs: int) -> None:
        """Per scale, the leading ghosts of one store (their removal clocks, in order) that
        pool would have served, looked up at removal ``at``."""
        for k in range(len(POOL_SCALES)):
            extra = self._extra(k)
            assert extra is not None
            served = 0
            for evicted_at in evicted:
                # The depth is never more than the removals since: only a ghost that many
                # removals would have pushed out needs the served ones counted.
                if at - evicted_at >= extra and self.depth(k, evicted_at, at) >= extra:
                    break
                served += 1
            if served:
                self._served[k].update(evicted[:served])
                self.gained[k] += served * bs

    def clear(self) -> None:
        """Every resident copy is gone (AllBlocksCleared): nothing is evicted by it, and the
        ghosts of the pool before are no pool's any more."""
        self.ghosts.clear()
        self._limit = MIN_REBUILD
        self._tips.clear()
        self._pending.clear()
        for served in self._served:
            served.clear()

    def gained_tokens(self) -> dict[str, int]:
        """Prompt tokens served from ghosts so far, by ``pool_scale`` (empty: no pool size)."""
        if self.pool_blocks is None:
            return {}
        return dict(zip(POOL_SCALES, self.gained, strict=True))


__all__ = ["MAX_TIPS", "POOL_SCALES", "WhatIf"]
