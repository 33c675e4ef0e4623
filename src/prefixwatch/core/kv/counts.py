"""What a KV mirror counts and hands out: histograms, divergences, a scrape's snapshot (pure)."""

from __future__ import annotations

import bisect
from bisect import bisect_right
from dataclasses import dataclass, field


@dataclass
class Divergence:
    """Where a new chain left the closest known chain, with the tokens on both sides."""

    position: int
    before: list[int]
    mine: list[int]
    theirs: list[int]
    chain_tokens: int  # the new chain's known length, for the own-content share
    #: The content id of the chain's root: a placeholder's (its start never seen, so the
    #: position counts from an unknown depth) is in FleetContent.placeholder_roots.
    root: int = 0


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

    def observe_ages(self, ages: list[float]) -> None:
        """``observe`` each of ``ages``, negative (clock skew) or NaN ages as 0: summed in
        order, then sorted and cut at the bounds (a bisection per bound, not per value)."""
        total = sum(ages)
        ordered = sorted(ages)
        if not (total == total and ordered[0] > 0.0):
            ages = [a if a > 0.0 else 0.0 for a in ages]
            total = sum(ages)
            ordered = sorted(ages)
        counts, bounds = self.counts, self.bounds
        lo, hi = bisect.bisect_left(bounds, ordered[0]), bisect.bisect_left(bounds, ordered[-1])
        if lo == hi:  # every age in one bucket: usual within one removal run
            counts[lo] += len(ordered)
        else:  # only the bounds between the smallest age and the largest cut them
            below = 0
            for k in range(lo, hi):
                upto = bisect_right(ordered, bounds[k])  # bisect_left(bounds, age) <= k
                counts[k] += upto - below
                below = upto
            counts[hi] += len(ordered) - below
        self.total += total
        self.n += len(ordered)

    def cumulative(self) -> list[tuple[float, int]]:
        out, run = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            run += count
            out.append((bound, run))
        return out


@dataclass(frozen=True)
class MirrorSnapshot:
    """A copy of one mirror's counters, for one scrape."""

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
    #: The pool what-if (core/kv/whatif.py): the device pool in blocks (None: not known) and
    #: the prompt tokens each larger pool would have served from what was evicted, by scale.
    pool_blocks: int | None = None
    whatif: dict[str, int] = field(default_factory=dict)
