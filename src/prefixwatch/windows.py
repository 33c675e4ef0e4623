"""Counter history and window math: Δhits/Δqueries that survive restarts.

Each series keeps a short history of *reset-adjusted* counter vectors. When a raw counter goes
down (or its ``_created`` time moves), the server restarted: the increase since the last poll is
the new raw value, as Prometheus' ``increase()`` counts it. A window's delta is then a plain
subtraction of two adjusted vectors, so a restart inside a window neither loses traffic nor
produces a negative rate.

History is kept in two tiers to bound memory: every poll for the short windows, and one point
per ``longest window / 120`` for the long ones (a 1 h window is then exact to 30 s).
"""

from __future__ import annotations

import bisect
import math
import re
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """'30s', '5m', '1h' -> seconds. Raises ValueError on anything else."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 30s, 5m, 1h)")
    seconds = float(match.group(1)) * _UNIT[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration must be positive: {text!r}")
    return seconds


@dataclass(frozen=True)
class Layout:
    """Where each counter role and histogram sits in a flat vector."""

    counters: tuple[str, ...]
    histograms: tuple[tuple[str, tuple[float, ...]], ...]  # role, bounds

    @property
    def size(self) -> int:
        return len(self.counters) + sum(len(b) + 2 for _, b in self.histograms)

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


class SeriesHistory:
    """Reset-adjusted cumulative vectors of one series over time."""

    def __init__(self, layout: Layout, fine_span: float, coarse_span: float,
                 coarse_step: float) -> None:
        self.layout = layout
        self._fine_span = fine_span
        self._coarse_span = coarse_span
        self._coarse_step = coarse_step
        self._fine_t: list[float] = []
        self._fine_v: list[array] = []
        self._coarse_t: list[float] = []
        self._coarse_v: list[array] = []
        self._last_raw: array | None = None
        self._last_created: float | None = None
        self._adjusted: array | None = None
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
        self._fine_t.append(t)
        self._fine_v.append(adjusted)
        if not self._coarse_t or t - self._coarse_t[-1] >= self._coarse_step:
            self._coarse_t.append(t)
            self._coarse_v.append(adjusted)
        self._trim(self._fine_t, self._fine_v, t - self._fine_span)
        self._trim(self._coarse_t, self._coarse_v, t - self._coarse_span)
        return reset

    @staticmethod
    def _trim(times: list[float], values: list[array], horizon: float) -> None:
        # Keep one point at or before the horizon, so the longest window has a base.
        cut = bisect.bisect_right(times, horizon) - 1
        if cut > 0:
            del times[:cut]
            del values[:cut]

    @property
    def points(self) -> int:
        return len(self._fine_t) + len(self._coarse_t)

    @property
    def latest_raw(self) -> array | None:
        return self._last_raw

    def delta(self, now: float, window: float) -> tuple[float, array] | None:
        """(seconds covered, adjusted delta vector) over the window ending at the last poll.

        The base is the newest point at or before ``now - window``; while the history is
        shorter than the window, the oldest point (the window covers what was seen).
        """
        if self._adjusted is None:
            return None
        if window <= self._fine_span - 1e-9 or not self._coarse_t:
            times, values = self._fine_t, self._fine_v
        else:
            times, values = self._coarse_t, self._coarse_v
        if len(times) < 1:
            return None
        idx = bisect.bisect_right(times, now - window) - 1
        idx = max(idx, 0)
        base_t = times[idx]
        last_t = self._fine_t[-1]
        if last_t <= base_t:
            return None
        base = values[idx]
        current = self._adjusted
        # A counter absent at the base appeared since: it counts from its first sighting (0).
        return last_t - base_t, array(
            "d", (c - (0.0 if b != b else b) for c, b in zip(current, base, strict=True)))


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
    total: array | None = None
    for vec in vectors:
        if total is None:
            total = array("d", vec)
        else:
            for i, v in enumerate(vec):
                total[i] += v
    return total
