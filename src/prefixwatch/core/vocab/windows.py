"""Counter history and window math: Δhits/Δqueries that survive restarts.

Each series keeps a short history of *reset-adjusted* counter vectors. When a raw counter goes
down (or its ``_created`` time moves), the server restarted: the increase since the last poll is
the new raw value, as Prometheus' ``increase()`` counts it. A window's delta is then a plain
subtraction of two adjusted vectors, so a restart inside a window neither loses traffic nor
produces a negative rate.

History is kept in tiers to bound memory: each window keeps about 60 points (one per poll for
the short windows, one a minute for a 1 h window, which is then exact to a minute).
"""

from __future__ import annotations

import bisect
import itertools
import math
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Seconds in each unit a duration may be written in (Prometheus' units, ``w`` and ``y`` aside).
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")


def parse_duration(text: str) -> float:
    """'30s', '5m', '1h' -> seconds. Raises ValueError on anything else."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h)")
    seconds = float(match.group(1)) * DURATION_UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return seconds


@dataclass(frozen=True)
class VectorLayout:
    """Where each counter role and histogram sits in a flat vector."""

    counters: tuple[str, ...]
    histograms: tuple[tuple[str, tuple[float, ...]], ...]  # role, bounds

    def offset_of(self, role: str) -> int:
        return self.counters.index(role)

    def histogram_slice(self, role: str) -> tuple[int, tuple[float, ...]] | None:
        """Start offset of (count, sum, bucket...) for the role, and its bounds."""
        offset = len(self.counters)
        for name, bounds in self.histograms:
            if name == role:
                return offset, bounds
            offset += len(bounds) + 2
        return None


@dataclass
class Tier:
    """Points kept ``resolution`` seconds apart for ``span`` seconds."""

    resolution: float
    span: float
    times: list[float]
    values: list[array]


def plan_tiers(windows: Iterable[float], interval: float, points_per_window: int = 60
               ) -> tuple[tuple[float, float], ...]:
    """(resolution, span) per tier: each window is resolved to 1/60 of itself (or the poll
    interval, whichever is coarser), so a window is exact to within ~2%."""
    tiers: dict[float, float] = {}
    for window in windows:
        resolution = max(interval, window / points_per_window)
        tiers[resolution] = max(tiers.get(resolution, 0.0), window + 2 * resolution)
    return tuple(sorted(tiers.items()))


@dataclass(frozen=True)
class HeldTier:
    """One tier's points as a view holds them."""

    resolution: float
    span: float
    times: tuple[float, ...]
    values: tuple[array, ...]


_lineages = itertools.count()


@dataclass(frozen=True, eq=False)
class HistoryView:
    """A SeriesHistory as it stood after one poll: what its readers get. It never changes, so
    it is read without a lock while the history takes the next poll; every view of one
    history has the same ``lineage`` (a restarted history is a new lineage)."""

    layout: VectorLayout
    lineage: int
    tiers: tuple[HeldTier, ...]
    last_t: float | None
    adjusted: array | None
    resets: int

    @property
    def points(self) -> int:
        """Distinct points held (tiers share the vectors they have in common)."""
        return len({id(v) for tier in self.tiers for v in tier.values})

    def tier_plan(self) -> tuple[tuple[float, float], ...]:
        """(resolution, span) of each tier, finest first."""
        return tuple((tier.resolution, tier.span) for tier in self.tiers)

    def held(self, tier: int = 0) -> tuple[float, float] | None:
        """(oldest, newest) time of the points one tier holds; None while it is empty."""
        times = self.tiers[tier].times
        return (times[0], times[-1]) if times else None

    def values_at(self, times: Iterable[float], picks: Sequence[int], tier: int = 0
                  ) -> list[list[float]]:
        """The ``picks`` components of the tier's newest point at or before each time (NaN
        before its first point): copies, so a reader cannot change the history."""
        held = self.tiers[tier]
        return [[math.nan] * len(picks) if (i := bisect.bisect_right(held.times, when) - 1) < 0
                else [held.values[i][p] for p in picks] for when in times]

    def delta(self, now: float, window: float) -> tuple[float, array] | None:
        """(seconds covered, adjusted delta vector) over the window ending at the last poll.

        The base is the newest point at or before ``now - window`` in the finest tier that
        spans the window; while the history is shorter than the window, its oldest point
        (the window covers what was seen).
        """
        if self.adjusted is None or self.last_t is None:
            return None
        tier = next((tr for tr in self.tiers if tr.span >= window), self.tiers[-1])
        idx = max(bisect.bisect_right(tier.times, now - window) - 1, 0)
        base_t = tier.times[idx]
        if self.last_t <= base_t:
            return None
        base = tier.values[idx]
        # A counter absent at the base appeared since: it counts from its first sighting (0).
        return self.last_t - base_t, array(
            "d", (c - (0.0 if b != b else b) for c, b in zip(self.adjusted, base, strict=True)))


class SeriesHistory:
    """Reset-adjusted cumulative vectors of one series over time, in resolution tiers. Its
    writer adds polls; readers get ``view()``, a copy that never changes."""

    def __init__(self, layout: VectorLayout, tiers: Sequence[tuple[float, float]],
                 interval: float) -> None:
        if not tiers:
            raise ValueError("at least one tier is needed")
        self.layout = layout
        self._tiers = [Tier(res, span, [], []) for res, span in sorted(tiers)]
        # A poll a little early still counts as the next point of a tier at poll resolution.
        self._slack = interval / 2
        self._last_t: float | None = None
        self._last_raw: array | None = None
        self._last_created: float | None = None
        self._adjusted: array | None = None
        self._lineage = next(_lineages)
        self._view: HistoryView | None = None
        self.resets = 0

    def add(self, t: float, raw: Sequence[float], created: float | None = None) -> bool:
        """Record a poll. Returns True when a reset (restart) was detected."""
        raw_arr = array("d", raw)
        reset = False
        if self._adjusted is None or self._last_raw is None:
            adjusted = array("d", raw_arr)
        else:
            restarted = (created is not None and self._last_created is not None
                         and created > self._last_created + 1e-6)
            adjusted = array("d", self._adjusted)
            for i, value in enumerate(raw_arr):
                prev = self._last_raw[i]
                if math.isnan(value):
                    continue
                if math.isnan(prev):
                    # The counter was missing last time: a new baseline, no known increase.
                    if math.isnan(adjusted[i]):
                        adjusted[i] = 0.0
                elif restarted or value < prev:
                    adjusted[i] += value
                    reset = True
                else:
                    adjusted[i] += value - prev
            reset = reset or restarted
        if reset:
            self.resets += 1
        self._last_raw = raw_arr
        self._last_created = created if created is not None else self._last_created
        self._adjusted = adjusted
        self._last_t = t
        for tier in self._tiers:
            if not tier.times or t - tier.times[-1] >= tier.resolution - self._slack:
                tier.times.append(t)
                tier.values.append(adjusted)
            self._trim(tier, t - tier.span)
        self._view = None
        return reset

    @staticmethod
    def _trim(tier: Tier, horizon: float) -> None:
        # Keep one point at or before the horizon, so the longest window has a base.
        cut = bisect.bisect_right(tier.times, horizon) - 1
        if cut > 0:
            del tier.times[:cut]
            del tier.values[:cut]

    def view(self) -> HistoryView:
        """The history as it stands now, for readers (made once per poll)."""
        if self._view is None:
            self._view = HistoryView(
                self.layout, self._lineage,
                tuple(HeldTier(t.resolution, t.span, tuple(t.times), tuple(t.values))
                      for t in self._tiers),
                self._last_t, self._adjusted, self.resets)
        return self._view

    @property
    def points(self) -> int:
        return self.view().points

    def tier_plan(self) -> tuple[tuple[float, float], ...]:
        return self.view().tier_plan()

    def held(self, tier: int = 0) -> tuple[float, float] | None:
        return self.view().held(tier)

    def values_at(self, times: Iterable[float], picks: Sequence[int], tier: int = 0
                  ) -> list[list[float]]:
        return self.view().values_at(times, picks, tier)

    def delta(self, now: float, window: float) -> tuple[float, array] | None:
        return self.view().delta(now, window)


def histogram_quantile(
    q: float, bounds: Sequence[float], cumulative: Sequence[float]
) -> float | None:
    """Prometheus' histogram_quantile on one cumulative bucket vector; None when empty."""
    if not bounds or len(bounds) != len(cumulative):
        return None
    total = cumulative[-1]
    if not total > 0 or math.isnan(total):
        return None
    rank = q * total
    for i, (bound, count) in enumerate(zip(bounds, cumulative, strict=True)):
        if count >= rank:
            if math.isinf(bound):
                return bounds[i - 1] if i > 0 else None
            lower = bounds[i - 1] if i > 0 else 0.0
            below = cumulative[i - 1] if i > 0 else 0.0
            in_bucket = count - below
            if in_bucket <= 0:
                return bound
            if i == 0 and bound <= 0:
                return bound
            return lower + (bound - lower) * (rank - below) / in_bucket
    return bounds[-2] if len(bounds) > 1 else None


def ratio(hits: float, queries: float) -> float | None:
    """hits/queries, or None (undefined) when there were no queries."""
    if math.isnan(hits) or math.isnan(queries) or queries <= 0:
        return None
    return min(max(hits / queries, 0.0), 1.0)


def sum_vectors(vectors: Iterable[Sequence[float]]) -> array | None:
    """The element-wise sum of equal-length vectors; None without any."""
    total: array | None = None
    for vec in vectors:
        if total is None:
            total = array("d", vec)
        else:
            for i, v in enumerate(vec):
                total[i] += v
    return total
