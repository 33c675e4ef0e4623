"""Pure arithmetic on fetched series: threshold crossings, alert intervals, incident phases.

Phases leave out the one rate window around each transition: a windowed ratio first falls
below the threshold only once bad traffic is inside its window, so everything up to
``first_drop - window`` is healthy traffic; likewise it recovers only once good traffic is
back, so everything after ``recovery`` is healthy and everything up to ``recovery - window``
is incident traffic. A sample stamped t describes traffic up to one scrape and one evaluation
before t, and a range query finds a crossing up to one step after the sample that crossed (the
two are the data's ``delay``), so the phases that end at a transition end that much earlier
again. The before/during/after figures are then never a mix of the two, and their times are
the traffic's own.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Interval:
    """A span of time in which something held (an alert fired, a cause was diagnosed)."""

    start: float
    end: float
    #: True when it still held at the last sample of the range.
    open: bool = False


@dataclass(frozen=True)
class AlertFiring:
    name: str
    severity: str
    labels: dict[str, str]
    interval: Interval
    #: When the alert became pending (ALERTS_FOR_STATE), if known.
    active_since: float | None = None


@dataclass(frozen=True)
class Phase:
    name: str  # before | during | after
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Crossings:
    """When a ratio first fell below the threshold and when it was back for good."""

    first_drop: float | None = None
    recovery: float | None = None
    #: The ratio was already below the threshold at the start of the range.
    low_at_start: bool = False
    drops: list[float] = field(default_factory=list)


def crossings(samples: Sequence[tuple[float, float]], threshold: float) -> Crossings:
    """Threshold crossings of one ratio series (samples in time order)."""
    out = Crossings()
    below_since: float | None = None
    for i, (t, v) in enumerate(samples):
        if v < threshold:
            if below_since is None:
                below_since = t
                out.drops.append(t)
                if i == 0:
                    out.low_at_start = True
                if out.first_drop is None:
                    out.first_drop = t
            out.recovery = None
        elif below_since is not None:
            below_since = None
            out.recovery = t
    return out


def phases(start: float, end: float, cross: Crossings, window: float,
           delay: float = 0.0) -> list[Phase]:
    """Before / during / after, each free of the transition window and the data's delay
    (see the module doc)."""
    out: list[Phase] = []
    if cross.first_drop is None:
        return [Phase("before", start, end)]
    margin = window + delay
    if not cross.low_at_start and cross.first_drop - margin > start:
        out.append(Phase("before", start, cross.first_drop - margin))
    during_end = cross.recovery - margin if cross.recovery is not None else end
    if during_end > cross.first_drop:
        out.append(Phase("during", cross.first_drop, during_end))
    if cross.recovery is not None and end > cross.recovery:
        out.append(Phase("after", cross.recovery, end))
    return out


def typical_spacing(series: Iterable[Sequence[tuple[float, float]]]) -> float | None:
    """The median gap between consecutive samples (the scrape or evaluation interval)."""
    gaps = [b[0] - a[0] for samples in series for a, b in zip(samples, samples[1:], strict=False)
            if b[0] > a[0]]
    return statistics.median(gaps) if gaps else None


def runs(samples: Sequence[tuple[float, float]], spacing: float, end: float,
         holds=lambda v: True) -> list[Interval]:
    """Spans where consecutive raw samples satisfy ``holds`` with no gap above 2.5 spacings:
    a longer gap is a resolution (Prometheus writes nothing while an alert is inactive)."""
    out: list[Interval] = []
    first = last = None
    for t, v in samples:
        if holds(v) and last is not None and t - last <= 2.5 * spacing:
            last = t
            continue
        if first is not None:
            out.append(Interval(first, last))
        first, last = (t, t) if holds(v) else (None, None)
    if first is not None:
        out.append(Interval(first, last, open=end - last <= 2.5 * spacing))
    return out


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Overlapping intervals as one (the fleet's view of per-target intervals)."""
    out: list[Interval] = []
    for iv in sorted(intervals, key=lambda i: i.start):
        if out and iv.start <= out[-1].end:
            last = out[-1]
            out[-1] = Interval(last.start, max(last.end, iv.end), last.open or iv.open)
        else:
            out.append(iv)
    return out
