"""Small inline-SVG charts for the landing page: hit ratio and TTFT p50 over the last hour.

Read from the monitors' own counter history (never changed here). Bins sit on a fixed grid:
edges at multiples of the bin width in wall-clock time, each read from one history tier (the
finest that holds the whole chart), so an edge older than a series' newest point can never
change. The completed bins of each (target, model) are therefore computed once and cached with
their formatted points; a render only computes the newest, partial bin (and, when the grid
moves on, the bin that just completed). The fleet's chart is the sum of its targets' bin
deltas (sum of hits over sum of queries, never a mean of ratios). Every label value is escaped;
nothing is fetched from outside.
"""

from __future__ import annotations

import html
import math
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from prefixwatch.core.windows import SeriesHistory, histogram_quantile, ratio

if TYPE_CHECKING:
    from prefixwatch.exporter.service import Exporter

SPAN_SECONDS = 3600.0
BINS = 48
WIDTH, HEIGHT, PAD = 360, 84, 4

Bounds = tuple[float, ...]


def _zeros() -> np.ndarray:
    return np.zeros((BINS, 2))


@dataclass
class Binned:
    """Per bin: query and hit deltas, then the TTFT buckets' deltas (cumulative, as the
    histogram's buckets are) when there is a histogram."""

    start: float
    end: float
    rows: np.ndarray = field(default_factory=_zeros)
    ttft_bounds: Bounds | None = None

    @property
    def queries(self) -> np.ndarray:
        return self.rows[:, 0]

    @property
    def hits(self) -> np.ndarray:
        return self.rows[:, 1]

    @property
    def ttft(self) -> np.ndarray | None:
        return self.rows[:, 2:] if self.ttft_bounds is not None else None

    def add(self, other: Binned) -> None:
        self.rows, self.ttft_bounds = _combine(self.rows, self.ttft_bounds, other.rows,
                                               other.ttft_bounds)

    def ratios(self) -> list[float | None]:
        return [_ratio(row) for row in self.rows[:, :2].tolist()]

    def ttft_p50(self) -> list[float | None] | None:
        if self.ttft_bounds is None:
            return None
        return [_median(self.ttft_bounds, row) for row in self.rows[:, 2:].tolist()]


def _combine(rows: np.ndarray, bounds: Bounds | None, other: np.ndarray,
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


def _median(bounds: Bounds, row: Sequence[float]) -> float | None:
    """TTFT p50 of one row of cumulative bucket deltas (core/windows.py, as everywhere)."""
    return histogram_quantile(0.5, bounds, row)


def _ratio(row: Sequence[float]) -> float | None:
    """Hits over queries of one row (core/windows.py: clamped, None without queries)."""
    return ratio(row[1], row[0])


# -- the grid -----------------------------------------------------------------------------------


def choose_width(plan: Sequence[tuple[float, float]], age: float) -> float:
    """The bin width: the chart spans the shortest window the history tiers can draw at one
    point per bin that covers ``age`` (a young exporter's whole history, not an hour of gaps),
    at most an hour. Few distinct widths, so the grid (and the cache) rarely changes."""
    spans = sorted({min(span - 2 * res, SPAN_SECONDS) for res, span in plan})
    drawable = [s for s in spans if s > 0 and _chart_tier(plan, s / BINS, strict=True) >= 0]
    if not drawable:  # no tier resolves a bin: the coarsest tier's span, with gaps
        return min(plan[-1][1], SPAN_SECONDS) / BINS
    return next((s for s in drawable if s >= age), drawable[-1]) / BINS


def _chart_tier(plan: Sequence[tuple[float, float]], width: float, strict: bool = False) -> int:
    """The finest tier that holds the whole chart (edges older than its span would be
    trimmed away); -1 (strict) or the coarsest when none both holds it and resolves a bin."""
    for i, (res, span) in enumerate(plan):
        if span >= width * BINS and res <= width:
            return i
    return -1 if strict else len(plan) - 1


def _final_edge(newest: float, width: float) -> int:
    """The grid index of the last edge strictly before ``newest`` (no later poll changes it)."""
    j = math.floor(newest / width)
    while j * width >= newest:
        j -= 1
    while (j + 1) * width < newest:
        j += 1
    return j


@dataclass(frozen=True)
class _Series:
    """How one history is read: which vector components, from which tier."""

    history: SeriesHistory
    picks: list[int]
    tier: int
    bounds: Bounds | None

    @classmethod
    def of(cls, history: SeriesHistory, width: float) -> _Series:
        layout = history.layout
        picks = [layout.offset_of("queries"), layout.offset_of("hits")]
        spot = layout.histogram_slice("ttft")
        if spot is not None:
            offset, bounds = spot
            picks += range(offset + 2, offset + 2 + len(bounds))
        return cls(history, picks, _chart_tier(history.tier_plan(), width),
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


def _deltas(values: list[list[float]]) -> np.ndarray:
    """Bin deltas between consecutive edge values; 0 where unknown (before a series started)."""
    d = np.diff(np.asarray(values, dtype=float), axis=0)
    return np.where(np.isfinite(d) & (d >= 0), d, 0.0)


def bin_history(histories: Sequence[SeriesHistory], now: float,
                width: float = SPAN_SECONDS / BINS) -> Binned:
    """One model's engines on one target, binned on the grid: the reference (uncached) way,
    the cache must give the same."""
    newest_bin = math.floor(now / width)
    first = newest_bin - BINS + 1
    out = Binned(first * width, now)
    for history in histories:
        series = _Series.of(history, width)
        newest = series.newest()
        if newest is None:
            continue
        end = series.end()
        values = series.edges(first, newest_bin, width, newest, end) + [end]
        out.rows, out.ttft_bounds = _combine(out.rows, out.ttft_bounds, _deltas(values),
                                             series.bounds)
    return out


# -- drawing ------------------------------------------------------------------------------------

#: Polyline coordinates are integers in tenths of a pixel (cheap to format), scaled back.
SCALE = 10
_XS = [f"{round((PAD + i * (WIDTH - 2 * PAD) / (BINS - 1)) * SCALE)}," for i in range(BINS)]


_BASE = (HEIGHT - PAD) * SCALE


def _ys(values: Sequence[float | None], top: float) -> list[str | None]:
    """Each bin's y coordinate, formatted (None: a gap, the bin saw no traffic). A bin's y
    depends only on its value and the scale, not on its place: the cache keeps them while
    bins scroll left."""
    height = (HEIGHT - 2 * PAD) * SCALE / top
    return [None if v is None or v != v else str(round(_BASE - height * min(v, top)))
            for v in values]


def _join(ys: Sequence[str | None]) -> tuple[list[str], bool]:
    """Polyline runs of "x,y" points (broken at gaps), and whether the last run is open (its
    last bin was drawn), so the next bin's point can extend it."""
    runs: list[str] = []
    current: list[str] = []
    for x, y in zip(_XS, ys, strict=False):  # ys may stop short of the last bin
        if y is None:
            if current:
                runs.append(" ".join(current))
                current = []
        else:
            current.append(x + y)
    if current:
        runs.append(" ".join(current))
    return runs, bool(current)


def _runs(values: Sequence[float | None], top: float) -> list[str]:
    return _join(_ys(values, top))[0]


def _with_point(runs: list[str], is_open: bool, i: int, v: float | None, top: float
                ) -> list[str]:
    """``runs`` (of the bins before ``i``) followed by bin ``i``'s point, as _runs would."""
    y = _ys((v,), top)[0]
    if y is None:
        return runs
    point = _XS[i] + y
    return [*runs[:-1], runs[-1] + " " + point] if is_open else [*runs, point]


@dataclass
class Chart:
    """What a card draws: the bins, their ratios, and the formatted polylines."""

    binned: Binned
    ratios: list[float | None]
    ratio_runs: list[str]
    p50_runs: list[str]
    peak: float | None

    @classmethod
    def of(cls, binned: Binned) -> Chart:
        """From scratch (the fleet, and the uncached reference)."""
        ratios = binned.ratios()
        p50 = binned.ttft_p50()
        peak = max((v for v in p50 if v is not None), default=None) if p50 else None
        p50_runs = _runs(p50, peak * 1.1) if p50 and peak else []
        return cls(binned, ratios, _runs(ratios, 1.0), p50_runs, peak)

    def current(self) -> float | None:
        """The newest bin with traffic."""
        return next((r for r in reversed(self.ratios) if r is not None), None)

    def svg(self, threshold: float, title: str) -> str:
        """Hit ratio (blue, 0-100%), threshold (red dashes), TTFT p50 (orange, own scale, its
        peak written at the top right)."""
        y_thr = HEIGHT - PAD - (HEIGHT - 2 * PAD) * threshold
        parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
                 f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img">'
                 f"<title>{html.escape(title)}</title>"
                 f'<rect x="0.5" y="0.5" width="{WIDTH - 1}" height="{HEIGHT - 1}" fill="#fff" '
                 'stroke="#ddd"/>'
                 f'<line x1="{PAD}" x2="{WIDTH - PAD}" y1="{y_thr:.1f}" y2="{y_thr:.1f}" '
                 'stroke="#d62728" stroke-dasharray="5 3" stroke-width="1"/>']
        if self.peak:
            for run in self.p50_runs:
                parts.append(f'<polyline points="{run}" fill="none" stroke="#f16913" '
                             'stroke-width="12" transform="scale(0.1)"/>')
            peak = self.peak
            label = f"{peak * 1000:.0f} ms" if peak < 1 else f"{peak:.1f} s"
            parts.append(f'<text x="{WIDTH - PAD - 2}" y="12" text-anchor="end" '
                         f'class="ttft">TTFT p50 peak {label}</text>')
        for run in self.ratio_runs:
            parts.append(f'<polyline points="{run}" fill="none" stroke="#08519c" '
                         'stroke-width="20" transform="scale(0.1)"/>')
        parts.append("</svg>")
        return "".join(parts)


def svg_chart(binned: Binned, threshold: float, title: str) -> str:
    """One chart, drawn from scratch."""
    return Chart.of(binned).svg(threshold, title)


# -- the cache ----------------------------------------------------------------------------------


class _Cached:
    """One (target, model)'s completed bins on one grid: bins ``lo``..``hi - 1`` (grid
    indices of their start edges) with their ratios, TTFT p50 and formatted y coordinates,
    and each series' value at edge ``hi`` (final), where the partial bin starts."""

    def __init__(self, series: list[_Series], width: float, lo: int) -> None:
        self.series = series
        self.histories = tuple(s.history for s in series)
        self.width = width
        self.lo = self.hi = lo
        # As _combine sums them: the first histogram's bounds.
        self.bounds = next((s.bounds for s in series if s.bounds is not None), None)
        self.cols = 2 + (len(self.bounds) if self.bounds is not None else 0)
        self.rows = np.zeros((0, self.cols))
        self.base = [s.history.values_at((lo * width,), s.picks, s.tier)[0] for s in series]
        self.ratios: list[float | None] = []
        self.ratio_ys: list[str | None] = []
        self.ratio_runs: list[str] = []
        self.ratio_open = False
        self.p50: list[float | None] = []
        self.p50_peak: float | None = None
        self.p50_top: float | None = None  # the scale p50_ys are for
        self.p50_ys: list[str | None] = []
        self.p50_runs: list[str] = []
        self.p50_open = False

    def _row(self, ends: list[list[float]]) -> list[float]:
        """One bin's row from each series' value at its end edge less the base: as _deltas
        and _combine compute it (the same floats), without numpy's per-call cost."""
        out, bounds = [0.0, 0.0], None
        for s, end, base in zip(self.series, ends, self.base, strict=True):
            d = [e - b for e, b in zip(end, base, strict=True)]
            d = [v if 0.0 <= v < math.inf else 0.0 for v in d]
            if s.bounds is None or (bounds is not None and bounds != s.bounds):
                out[0] += d[0]
                out[1] += d[1]
            elif bounds is None:
                out, bounds = [out[0] + d[0], out[1] + d[1], *d[2:]], s.bounds
            else:
                out = [a + b for a, b in zip(out, d, strict=True)]
        return out

    def _complete(self, hi: int) -> None:
        """Cache bins ``self.hi``..``hi - 1``, whose edges are all final now."""
        w = self.width
        ends = [s.history.values_at([j * w for j in range(self.hi + 1, hi + 1)], s.picks,
                                    s.tier) for s in self.series]
        if hi - self.hi > 2:  # a cold start: numpy is cheaper over many bins
            rows = np.zeros((hi - self.hi, 2))
            bounds: Bounds | None = None
            for s, base, values in zip(self.series, self.base, ends, strict=True):
                rows, bounds = _combine(rows, bounds, _deltas([base, *values]), s.bounds)
            listed = rows.tolist()
        else:
            listed = []
            for i in range(hi - self.hi):
                listed.append(self._row([values[i] for values in ends]))
                self.base = [values[i] for values in ends]
            rows = np.asarray(listed, dtype=float).reshape(-1, self.cols)
        self.base = [values[-1] for values in ends]
        self.rows = np.concatenate((self.rows, rows))
        ratios = [_ratio(r) for r in listed]
        self.ratios += ratios
        self.ratio_ys += _ys(ratios, 1.0)
        if self.bounds is not None:
            p50 = [_median(self.bounds, r[2:]) for r in listed]
            self.p50 += p50
            if self.p50_top is not None:
                self.p50_ys += _ys(p50, self.p50_top)
        self.hi = hi

    def update(self, lo: int, newest: float) -> bool:
        """Bring the completed bins to ``lo``..(the last final edge); False when the cache
        cannot (it must be rebuilt)."""
        if lo < self.lo or self.hi < lo:
            return False
        hi = min(lo + BINS - 1, _final_edge(newest, self.width))
        if hi < self.hi:
            return False
        if lo == self.lo and hi == self.hi:
            return True
        drop = lo - self.lo
        self.rows, self.ratios, self.ratio_ys = (self.rows[drop:], self.ratios[drop:],
                                                 self.ratio_ys[drop:])
        self.p50, self.p50_ys = self.p50[drop:], self.p50_ys[drop:]
        self.lo = lo
        if hi > self.hi:
            self._complete(hi)
        self.ratio_runs, self.ratio_open = _join(self.ratio_ys)
        self.p50_peak = max((v for v in self.p50 if v is not None), default=None)
        if self.p50_top is not None:
            self.p50_runs, self.p50_open = _join(self.p50_ys)
        return True

    def chart(self, now: float) -> Chart:
        """The cached bins and the partial one (from edge ``hi`` to each series' newest point;
        the bins after it, if this target lags the others, saw nothing yet)."""
        tail = self._row([s.end() for s in self.series])
        done = len(self.ratios)
        rows = np.zeros((BINS, self.cols))
        rows[:done] = self.rows
        rows[done] = tail
        gap = [None] * (BINS - done - 1)
        newest = _ratio(tail)
        ratios = [*self.ratios, newest, *gap]
        ratio_runs = _with_point(self.ratio_runs, self.ratio_open, done, newest, 1.0)
        peak, p50_runs = None, []
        if self.bounds is not None:
            p50 = _median(self.bounds, tail[2:])
            peak = self.p50_peak if p50 is None or (
                self.p50_peak is not None and p50 <= self.p50_peak) else p50
            if peak:
                top = peak * 1.1
                if top != self.p50_top:
                    self.p50_top, self.p50_ys = top, _ys(self.p50, top)
                    self.p50_runs, self.p50_open = _join(self.p50_ys)
                p50_runs = _with_point(self.p50_runs, self.p50_open, done, p50, top)
        return Chart(Binned(self.lo * self.width, now, rows, self.bounds), ratios, ratio_runs,
                     p50_runs, peak)


class ChartCache:
    """Per exporter: each (target, model)'s completed bins, reused while the grid and the
    model's histories (the same objects: a restarted history is a new one) stay the same."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.width: float | None = None
        self.entries: dict[tuple[str, str], _Cached] = {}

    def chart(self, key: tuple[str, str], histories: Sequence[SeriesHistory], now: float,
              width: float) -> Chart:
        """The model's chart, computing only what the cache lacks (call under the target's
        lock: it reads the histories)."""
        lo = math.floor(now / width) - BINS + 1
        newests = [h.held(0) for h in histories]
        newest = min((h[1] for h in newests if h is not None), default=None)
        cached = self.entries.get(key)
        if (newest is None or any(h is None or h[1] != newest for h in newests)
                or _final_edge(newest, width) < lo):
            # Engines polled at different times, or nothing final yet: nothing to cache.
            self.entries.pop(key, None)
            return Chart.of(bin_history(histories, now, width))
        if cached is None or cached.histories != tuple(histories) or cached.width != width \
                or not cached.update(lo, newest):
            cached = _Cached([_Series.of(h, width) for h in histories], width, lo)
            cached.update(lo, newest)
            self.entries[key] = cached
        return cached.chart(now)


_CACHES: weakref.WeakKeyDictionary[Exporter, ChartCache] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def _cache_of(exporter: Exporter) -> ChartCache:
    with _CACHES_LOCK:
        cache = _CACHES.get(exporter)
        if cache is None:
            cache = _CACHES[exporter] = ChartCache()
        return cache


# -- the section --------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.3g} min" if seconds >= 120 else f"{seconds:.3g} s"


def _pct(value: float | None) -> str:
    return "no traffic" if value is None else f"{value:.1%}"


def charts_section(exporter: Exporter, now: float, cached: bool = True) -> str:
    """The landing page's charts: each model's fleet, then each target's, with its diagnosis.
    ``cached=False`` draws everything from scratch (the reference the cache must match)."""
    threshold = exporter.config.thresholds.hit_ratio
    cache = _cache_of(exporter)
    with cache.lock:
        return _section(exporter, now, threshold, cache if cached else None)


def _section(exporter: Exporter, now: float, threshold: float, cache: ChartCache | None) -> str:
    latest = max((m.last_success for m in exporter.monitors if m.last_success == m.last_success),
                 default=now)
    oldest = latest
    plan: tuple[tuple[float, float], ...] = ()
    for mon in exporter.monitors:
        with mon.lock:
            for state in mon.series.values():
                if state.history is not None:
                    held = state.history.held(-1)
                    plan = plan or state.history.tier_plan()
                    if held is not None:
                        oldest = min(oldest, held[0])
    width = choose_width(plan, latest - oldest) if plan else SPAN_SECONDS / BINS
    if cache is not None and cache.width != width:
        cache.entries.clear()
        cache.width = width
    seen: set[tuple[str, str]] = set()
    per_target: list[tuple[str, str, Chart]] = []
    fleet: dict[str, Binned] = {}
    for mon in exporter.monitors:
        with mon.lock:
            if not mon.up:
                continue
            by_model: dict[str, list[SeriesHistory]] = {}
            for (model, _engine), state in mon.series.items():
                if state.history is not None:
                    by_model.setdefault(model, []).append(state.history)
            if cache is None:
                charts = {m: Chart.of(bin_history(h, latest, width)) for m, h in by_model.items()}
            else:
                charts = {m: cache.chart((mon.name, m), h, latest, width)
                          for m, h in by_model.items()}
                seen.update((mon.name, m) for m in by_model)
        for model, chart in sorted(charts.items()):
            per_target.append((mon.name, model, chart))
            b = chart.binned
            if model in fleet:
                fleet[model].add(b)
            else:
                fleet[model] = Binned(b.start, b.end, b.rows.copy(), b.ttft_bounds)
    if cache is not None:
        for key in set(cache.entries) - seen:
            del cache.entries[key]
    with exporter.state.lock:
        active = {key: exporter.state.diagnosis.active(*key)
                  for key in exporter.state.diagnosis.causes}
    out = [f'<h2>Hit ratio over time</h2><p class="legend"><span style="color:#08519c">&#9644; hit '
           f'ratio</span> (0-100%) &middot; <span style="color:#d62728">- - threshold '
           f'{threshold:.0%}</span> &middot; <span style="color:#f16913">&#9644; TTFT p50'
           f"</span> (own scale) &middot; the last {_duration(width * BINS)}, one point per "
           f"{_duration(width)}; the page refreshes itself every 15 s</p>"]
    for model, b in sorted(fleet.items()):
        causes = sorted({c for (t, m), cs in active.items() if m == model for c in cs})
        out.append(_card("fleet", model, Chart.of(b), threshold, causes, fleet=True))
    out.append('<div class="cards">')
    for target, model, chart in per_target:
        out.append(_card(target, model, chart, threshold, active.get((target, model), [])))
    out.append("</div>")
    return "".join(out)


def _card(target: str, model: str, chart: Chart, threshold: float, causes: list[str],
          fleet: bool = False) -> str:
    esc = html.escape
    now = chart.current()
    low = now is not None and now < threshold
    title = f"{'fleet' if fleet else target}: {model}"
    diagnosis = ", ".join(causes) if causes else "no cause holds"
    return (f'<div class="card{" fleet" if fleet else ""}"><div class="head">'
            f"<b>{esc(target)}</b> &middot; {esc(model)} &middot; "
            f'<span class="{"low" if low else "ok"}">{_pct(now)}</span></div>'
            f"{chart.svg(threshold, title)}"
            f'<div class="diag">diagnosis: {esc(diagnosis)}</div></div>')
