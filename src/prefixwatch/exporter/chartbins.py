"""The landing page charts' bins: counter history read on a fixed wall-clock grid.

Bins sit on a fixed grid: edges at multiples of the bin width in wall-clock time, each read from
one history tier (the finest that holds the whole chart), so an edge older than a series'
newest point can never change and a completed bin can be cached (exporter/charts.py). Ratios
and quantiles of a bin are core/vocab/windows.py's, as everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from prefixwatch.core.vocab.windows import HistoryView, histogram_quantile, ratio

SPAN_SECONDS = 3600.0
BINS = 48

Bounds = tuple[float, ...]


@dataclass
class Binned:
    """Per bin: query and hit deltas, then the TTFT buckets' deltas (cumulative, as the
    histogram's buckets are) when there is a histogram."""

    start: float
    end: float
    rows: np.ndarray = field(default_factory=lambda: np.zeros((BINS, 2)))
    ttft_bounds: Bounds | None = None

    @property
    def queries(self) -> np.ndarray:
        return self.rows[:, 0]

    def add(self, other: Binned) -> None:
        self.rows, self.ttft_bounds = combine(self.rows, self.ttft_bounds, other.rows,
                                               other.ttft_bounds)

    def ratios(self) -> list[float | None]:
        return [bin_ratio(row) for row in self.rows[:, :2].tolist()]

    def ttft_p50(self) -> list[float | None] | None:
        if self.ttft_bounds is None:
            return None
        return [median(self.ttft_bounds, row) for row in self.rows[:, 2:].tolist()]


def combine(rows: np.ndarray, bounds: Bounds | None, other: np.ndarray,
             other_bounds: Bounds | None) -> tuple[np.ndarray, Bounds | None]:
    """Sum two engines' (or targets') bin rows. TTFT buckets add only when their bounds agree
    (the first histogram seen wins); queries and hits always add. One code path for cached and
    fresh renders, so both sum the same floats in the same order."""
    if other_bounds is None or (bounds is not None and bounds != other_bounds):
        out = rows.copy()
        out[:, :2] += other[:, :2]
        return out, bounds
    if bounds is None:
        return np.concatenate((rows[:, :2] + other[:, :2], other[:, 2:]), axis=1), other_bounds
    return rows + other, bounds


def median(bounds: Bounds, row: Sequence[float]) -> float | None:
    """TTFT p50 of one row of cumulative bucket deltas (core/vocab/windows.py, as everywhere)."""
    return histogram_quantile(0.5, bounds, row)


def bin_ratio(row: Sequence[float]) -> float | None:
    """Hits over queries of one row (core/vocab/windows.py: clamped, None without queries)."""
    return ratio(row[1], row[0])


def choose_width(plan: Sequence[tuple[float, float]], age: float) -> float:
    """The bin width: the chart spans the shortest window the history tiers can draw at one
    point per bin that covers ``age`` (a young exporter's whole history, not an hour of gaps),
    at most an hour. Few distinct widths, so the grid (and the cache) rarely changes."""
    spans = sorted({min(span - 2 * res, SPAN_SECONDS) for res, span in plan})
    drawable = [s for s in spans if s > 0 and chart_tier(plan, s / BINS, strict=True) >= 0]
    if not drawable:  # no tier resolves a bin: the coarsest tier's span, with gaps
        return min(plan[-1][1], SPAN_SECONDS) / BINS
    return next((s for s in drawable if s >= age), drawable[-1]) / BINS


def chart_tier(plan: Sequence[tuple[float, float]], width: float, strict: bool = False) -> int:
    """The finest tier that holds the whole chart (edges older than its span would be
    trimmed away); -1 (strict) or the coarsest when none both holds it and resolves a bin."""
    for i, (res, span) in enumerate(plan):
        if span >= width * BINS and res <= width:
            return i
    return -1 if strict else len(plan) - 1


def final_edge(newest: float, width: float) -> int:
    """The grid index of the last edge strictly before ``newest`` (no later poll changes it)."""
    j = math.floor(newest / width)
    while j * width >= newest:
        j -= 1
    while (j + 1) * width < newest:
        j += 1
    return j


@dataclass(frozen=True)
class SeriesReader:
    """How one history is read: which vector components, from which tier."""

    history: HistoryView
    picks: list[int]
    tier: int
    bounds: Bounds | None

    @classmethod
    def of(cls, history: HistoryView, width: float, served: str = "hits") -> SeriesReader:
        """Queries and the ``served`` counter role (the device's hits, or every tier's cached
        tokens), then the TTFT buckets."""
        layout = history.layout
        picks = [layout.offset_of("queries"), layout.offset_of(served)]
        spot = layout.histogram_slice("ttft")
        if spot is not None:
            offset, bounds = spot
            picks += range(offset + 2, offset + 2 + len(bounds))
        return cls(history, picks, chart_tier(history.tier_plan(), width),
                   tuple(spot[1]) if spot is not None else None)

    def newest(self) -> float | None:
        held = self.history.held(0)
        return held[1] if held is not None else None

    def end(self) -> list[float]:
        """The newest point: where the partial bin ends."""
        return self.history.values_at((math.inf,), self.picks, 0)[0]

    def edges(self, first: int, last: int, width: float, newest: float,
              end: list[float]) -> list[list[float]]:
        """Values at grid edges first..last: an edge before the newest point from the chart's
        tier (final), a later one the newest point."""
        final = [t for t in (j * width for j in range(first, last + 1)) if t < newest]
        return (self.history.values_at(final, self.picks, self.tier)
                + [end] * (last + 1 - first - len(final)))


def deltas(values: list[list[float]]) -> np.ndarray:
    """Bin deltas between consecutive edge values; 0 where unknown (before a series started)."""
    d = np.diff(np.asarray(values, dtype=float), axis=0)
    return np.where(np.isfinite(d) & (d >= 0), d, 0.0)


def bin_history(histories: Sequence[HistoryView], now: float,
                width: float = SPAN_SECONDS / BINS, served: str = "hits") -> Binned:
    """One model's engines on one target, binned on the grid: the reference (uncached) way,
    the cache must give the same."""
    newest_bin = math.floor(now / width)
    first = newest_bin - BINS + 1
    out = Binned(first * width, now)
    for history in histories:
        series = SeriesReader.of(history, width, served)
        newest = series.newest()
        if newest is None:
            continue
        end = series.end()
        values = series.edges(first, newest_bin, width, newest, end) + [end]
        out.rows, out.ttft_bounds = combine(out.rows, out.ttft_bounds, deltas(values),
                                             series.bounds)
    return out
