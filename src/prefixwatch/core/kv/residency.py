"""One engine's resident block copies by medium and engine hash, with exact copy counts (pure).

vLLM can cache two physical copies of one content and drop them separately, and a lower tier
(CPU, disk) holds copies of its own: per medium, engine hash -> its content block (None: not
known) and the stored time of each copy (one float; a list for two or more, so there is no
object per resident block for the cyclic collector to walk). The content each replica holds,
every medium, is counted in its ``held``, and what it removed is in its ``evicted`` (the
fleet's routing, eviction and forgetting read both).

An event's blocks are held and removed in bulk (dictionary updates, and one ``map`` of a
dict's ``get`` or ``pop`` over the event's hashes, a sort for the lifetimes); a copy at a time
only for a run that names a hash held twice, a hash not resident, or one hash twice.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import compress, repeat
from typing import Any

from prefixwatch.core.kv.content import Block
from prefixwatch.core.kv.counts import Histogram
from prefixwatch.core.vocab import exposition

#: Hashes of removed blocks kept per replica (a later chain may name one as its parent).
RECENT_REMOVED = 65_536


class Residency:
    """Resident copies of one replica (``held`` and ``evicted`` shared with its fleet)."""

    def __init__(self, held: Counter[Block], evicted: set[Block]) -> None:
        self.held = held
        self.evicted = evicted
        #: medium -> block hash -> its content block (None: not known); and the stored ts of
        #: its copies.
        self.resident: dict[str, dict[Any, Block | None]] = {}
        self.since: dict[str, dict[Any, Any]] = {}
        #: medium -> its hashes that hold two copies or more (a list in ``since``).
        self.multi: dict[str, set[Any]] = {}
        self.count: dict[str, int] = {}
        self.total = 0  # resident copies, every medium
        self.lifetimes: dict[str, Histogram] = {}
        self.recent: dict[Any, Block] = {}  # removed hashes, the oldest first

    def tier(self, medium: str) -> tuple[dict[Any, Block | None], dict[Any, Any]]:
        """The resident blocks of one medium and their copies' stored times."""
        res = self.resident.get(medium)
        if res is None:
            res = self.resident[medium] = {}
            self.since[medium] = {}
        return res, self.since[medium]

    def lookup(self, h: Any) -> Block | None:
        """The content of engine hash ``h``: resident in any medium, or removed lately."""
        for per in self.resident.values():
            node = per.get(h)
            if node is not None:
                return node
        return self.recent.get(h)

    def lookup_many(self, hashes: Sequence[Any]) -> list[Block | None]:
        """``lookup`` of each hash, a medium at a time (then the removed ones)."""
        got: list[Block | None] | None = None
        for per in (*self.resident.values(), self.recent):
            if got is None:
                got = list(map(per.get, hashes))  # all in the first medium: common
                if not any(got):
                    got = None  # none there (or none with its content known)
                    continue
            elif not per.keys().isdisjoint(hashes):
                get = per.get
                got = [g if g is not None else get(h) for g, h in zip(got, hashes, strict=True)]
            if all(got):  # (a Block is always true: faster than ``None not in``)
                break
        return [None] * len(hashes) if got is None else got

    # -- holding -------------------------------------------------------------------------------

    def hold(self, medium: str, hashes: Sequence[Any], nodes: Sequence[Block | None],
             ts: float) -> None:
        """One more resident copy of each block (the caller has checked the cap)."""
        res, since = self.tier(medium)
        n = len(hashes)
        before = len(res)
        if res.keys().isdisjoint(hashes):
            res.update(zip(hashes, nodes, strict=True))
            if len(res) == before + n:  # every hash new, none twice: the common case
                since.update(zip(hashes, repeat(ts)))
                self.held.update(nodes if all(nodes) else filter(None, nodes))
                self.count[medium] = self.count.get(medium, 0) + n
                self.total += n
                return
            for h in hashes:  # undone: a hash twice in one event
                res.pop(h, None)
        for h, node in zip(hashes, nodes, strict=True):
            self.hold_one(medium, res, since, h, node, ts)
        self.count[medium] = self.count.get(medium, 0) + n
        self.total += n

    def hold_one(self, medium: str, res: dict[Any, Block | None], since: dict[Any, Any], h: Any,
                 node: Block | None, ts: float) -> None:
        """One more copy of block ``h`` in ``res`` (the caller counts it)."""
        if h not in res:
            res[h] = node
            since[h] = ts
        else:
            if res[h] is None:
                res[h] = node
            else:
                node = res[h]  # a copy of the content it holds (what its removal releases)
            copies = since[h]
            if type(copies) is list:
                copies.append(ts)
            else:
                since[h] = [copies, ts]
                self.multi.setdefault(medium, set()).add(h)
        if node is not None:
            self.held[node] += 1

    def room(self, max_resident: int, medium: str, hashes: Sequence[Any]) -> int:
        """How many of ``hashes``, in order, can be held under ``max_resident`` copies: a copy
        of a resident hash always can, a new hash only while there is room."""
        room = max_resident - self.total
        n = len(hashes)
        if n <= room:
            return n
        res = self.resident.get(medium) or {}
        seen: set[Any] = set(hashes[:max(room, 0)])
        for i in range(max(room, 0), n):
            h = hashes[i]
            if h not in res and h not in seen:
                return i
            seen.add(h)
        return n

    # -- removing ------------------------------------------------------------------------------

    def remove(self, hashes: Sequence[Any], medium: str, ts: float) -> int:
        """The oldest copy of each block goes (its lifetime observed); returns how many of
        ``hashes`` were not resident."""
        hist = self.lifetimes.get(medium)
        if hist is None:
            hist = self.lifetimes[medium] = Histogram(exposition.KV_LIFETIME_BUCKETS)
        res = self.resident.get(medium)
        if res is None or not hashes:
            return len(hashes)  # none of them resident (or none named)
        since = self.since[medium]
        multi = self.multi.get(medium)
        if multi and not multi.isdisjoint(hashes):  # some of them have copies
            return self._remove_each(res, since, hist, hashes, medium, ts)
        # One copy of each, every one resident (the common case): taken and deleted at once;
        # a hash not resident, or named twice, is seen in what the pops left (then undone).
        n = len(hashes)
        before = len(since)
        stamps = list(map(since.pop, hashes, repeat(None)))
        if len(since) != before - n:
            for h, s in zip(hashes, stamps, strict=True):
                if s is not None:
                    since[h] = s
            return self._remove_each(res, since, hist, hashes, medium, ts)
        nodes = list(map(res.pop, hashes))
        hist.observe_ages(list(map(ts.__sub__, stamps)) if type(ts) is float
                          else [ts - s for s in stamps])
        self.count[medium] = self.count.get(medium, 0) - n
        self.total -= n
        if not all(nodes):
            self.recent.update(compress(zip(hashes, nodes, strict=True), nodes))
            nodes = tuple(filter(None, nodes))
        else:
            self.recent.update(zip(hashes, nodes, strict=True))
        self._release(nodes)
        self._forget_recent()
        return 0

    def _remove_each(self, res: dict[Any, Block | None], since: dict[Any, Any],
                     hist: Histogram, hashes: Sequence[Any], medium: str, ts: float) -> int:
        """``remove`` a copy at a time (one of ``hashes`` has copies, or is not resident)."""
        unknown = 0
        ages: list[float] = []
        gone: list[Block] = []
        for h in hashes:
            copies = since.get(h)
            if copies is None:
                unknown += 1
                continue
            node = res[h]
            if type(copies) is list:  # the oldest copy: which one went is not said
                ages.append(ts - copies.pop(0))
                if len(copies) == 1:
                    since[h] = copies[0]
                    self.multi[medium].discard(h)
            else:
                ages.append(ts - copies)
                del res[h], since[h]
                if node is not None:
                    self.recent[h] = node
            if node is not None:
                gone.append(node)
        if ages:
            hist.observe_ages(ages)
            self.count[medium] = self.count.get(medium, 0) - len(ages)
            self.total -= len(ages)
        self._release(gone)
        self._forget_recent()
        return unknown

    def _release(self, nodes: Sequence[Block]) -> None:
        """One copy fewer of each content block held (each now evicted by this replica)."""
        held = self.held
        copies = list(map(held.pop, nodes, repeat(0)))
        if copies.count(1) != len(copies):  # not the last copy of each: the rest put back
            if 0 not in copies:  # each held, and once in the run
                rest = list(map((1).__rsub__, copies))
                dict.update(held, compress(zip(nodes, rest, strict=True), rest))  # (set)
            else:  # a block named twice, or not held: in order
                left: dict[Block, int] = {}
                for node, k in zip(nodes, copies, strict=True):
                    if k:
                        left[node] = k - 1
                    elif node in left:  # named again (popped already)
                        left[node] -= 1
                dict.update(held, {node: k for node, k in left.items() if k > 0})  # (set)
        self.evicted.update(nodes)

    def _forget_recent(self) -> None:
        recent = self.recent
        while len(recent) > RECENT_REMOVED:
            del recent[next(iter(recent))]

    def clear(self) -> None:
        """Every resident copy is gone; the content stays known, and it is no eviction."""
        self.held.clear()
        self.resident.clear()
        self.since.clear()
        self.multi.clear()
        self.count = dict.fromkeys(self.count, 0)
        self.total = 0
        self.recent.clear()
