"""Small inline-SVG charts for the landing page: hit ratio and TTFT p50 over the last hour.

Read from the views of the monitors' counter history (never changed), binned on a fixed grid
(exporter/chartbins.py), so an edge older than a series' newest point can never change. The
completed bins of each (target, model) are therefore computed once and cached with
their formatted points; a render only computes the newest, partial bin (and, when the grid
moves on, the bin that just completed). The fleet's chart is the sum of its targets' bin
deltas (sum of hits over sum of queries, never a mean of ratios). Every label value is escaped;
nothing is fetched from outside.
"""

from __future__ import annotations

import html
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from prefixwatch.core.vocab.windows import HistoryView
from prefixwatch.exporter.chartbins import (
    BINS,
    Binned,
    Bounds,
    SeriesReader,
    bin_history,
    bin_ratio,
    combine,
    deltas,
    final_edge,
    median,
)

WIDTH, HEIGHT, PAD = 360, 84, 4
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
        return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
                f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img">'
                f"<title>{html.escape(title)}</title>"
                f'<rect x="0.5" y="0.5" width="{WIDTH - 1}" height="{HEIGHT - 1}" fill="#fff" '
                f'stroke="#ddd"/>{self._plot(threshold, label_peak=True)}</svg>')

    def _plot(self, threshold: float, label_peak: bool, scaled: bool = False) -> str:
        """The lines in the card's coordinates; ``scaled``: drawn into a larger box, so the
        strokes keep their width on the screen."""
        y_thr = HEIGHT - PAD - (HEIGHT - 2 * PAD) * threshold
        keep = ' vector-effect="non-scaling-stroke"' if scaled else ""
        parts = [f'<line x1="{PAD}" x2="{WIDTH - PAD}" y1="{y_thr:.1f}" y2="{y_thr:.1f}" '
                 f'stroke="#d62728" stroke-dasharray="5 3" stroke-width="1"{keep}/>']
        line = ('<polyline points="{}" fill="none" stroke="{}" stroke-width="{}" '
                'transform="scale(0.1)"' + keep + "/>")
        if self.peak:
            parts += [line.format(run, "#f16913", 1.5 if scaled else 12)
                      for run in self.p50_runs]
            if label_peak:
                parts.append(f'<text x="{WIDTH - PAD - 2}" y="12" text-anchor="end" '
                             f'class="ttft">TTFT p50 peak {ttft_label(self.peak)}</text>')
        parts += [line.format(run, "#08519c", 2.5 if scaled else 20) for run in self.ratio_runs]
        return "".join(parts)

    def svg_with_axes(self, threshold: float, title: str, width: int = 900,
                      height: int = 230) -> str:
        """The headline chart: the card's lines in a larger box with axes, the hit ratio's
        0-100% on the left, TTFT p50's scale on the right, the clock time below."""
        left, right, top, bottom = 48, 70, 8, 34
        w, h = width - left - right, height - top - bottom
        esc = html.escape
        parts = [f'<svg class="chart big" xmlns="http://www.w3.org/2000/svg" width="{width}" '
                 f'height="{height}" viewBox="0 0 {width} {height}" role="img">'
                 f"<title>{esc(title)}</title>"
                 f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fff" '
                 'stroke="#bbb"/>']
        inner = h - 2 * PAD * h / HEIGHT
        for share in (0.0, 0.25, 0.5, 0.75, 1.0):
            y = top + h * (1 - PAD / HEIGHT) - inner * share
            parts.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" '
                         f'stroke="#eee"/><text x="{left - 6}" y="{y + 4:.1f}" '
                         f'text-anchor="end" class="axis">{share:.0%}</text>')
            if self.peak:
                parts.append(f'<text x="{left + w + 6}" y="{y + 4:.1f}" class="axis ttft">'
                             f"{ttft_label(self.peak * 1.1 * share)}</text>")
        b = self.binned
        for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
            x = left + w * frac
            at = time.strftime("%H:%M:%S", time.localtime(b.start + (b.end - b.start) * frac))
            anchor = "start" if frac == 0 else "end" if frac == 1 else "middle"
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top + h}" y2="{top + h + 4}" '
                         f'stroke="#999"/><text x="{x:.1f}" y="{top + h + 16}" '
                         f'text-anchor="{anchor}" class="axis">{at}</text>')
        parts.append(f'<text x="{left - 40}" y="{top + 10}" class="axis" '
                     f'transform="rotate(-90 {left - 40} {top + 10})" text-anchor="end">'
                     "hit ratio</text>")
        if self.peak:
            parts.append(f'<text x="{width - 4}" y="{top + h + 30}" text-anchor="end" '
                         'class="axis ttft">TTFT p50 (right scale)</text>')
        parts.append(f'<svg x="{left}" y="{top}" width="{w}" height="{h}" '
                     f'viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none">'
                     f"{self._plot(threshold, label_peak=False, scaled=True)}</svg>")
        return "".join(parts) + "</svg>"


def ttft_label(seconds: float) -> str:
    """A TTFT on the charts: milliseconds under a second."""
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def svg_chart(binned: Binned, threshold: float, title: str) -> str:
    """One chart, drawn from scratch."""
    return Chart.of(binned).svg(threshold, title)


class _Cached:
    """One (target, model)'s completed bins on one grid: bins ``lo``..``hi - 1`` (grid
    indices of their start edges) with their ratios, TTFT p50 and formatted y coordinates,
    and each series' value at edge ``hi`` (final), where the partial bin starts."""

    def __init__(self, series: list[SeriesReader], width: float, lo: int) -> None:
        self.series = series
        self.lineages = tuple(s.history.lineage for s in series)
        self.width = width
        self.lo = self.hi = lo
        # As combine sums them: the first histogram's bounds.
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
        """One bin's row from each series' value at its end edge less the base: as deltas
        and combine compute it (the same floats), without numpy's per-call cost."""
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
                rows, bounds = combine(rows, bounds, deltas([base, *values]), s.bounds)
            listed = rows.tolist()
        else:
            listed = []
            for i in range(hi - self.hi):
                listed.append(self._row([values[i] for values in ends]))
                self.base = [values[i] for values in ends]
            rows = np.asarray(listed, dtype=float).reshape(-1, self.cols)
        self.base = [values[-1] for values in ends]
        self.rows = np.concatenate((self.rows, rows))
        ratios = [bin_ratio(r) for r in listed]
        self.ratios += ratios
        self.ratio_ys += _ys(ratios, 1.0)
        if self.bounds is not None:
            p50 = [median(self.bounds, r[2:]) for r in listed]
            self.p50 += p50
            if self.p50_top is not None:
                self.p50_ys += _ys(p50, self.p50_top)
        self.hi = hi

    def update(self, lo: int, newest: float) -> bool:
        """Bring the completed bins to ``lo``..(the last final edge); False when the cache
        cannot (it must be rebuilt)."""
        if lo < self.lo or self.hi < lo:
            return False
        hi = min(lo + BINS - 1, final_edge(newest, self.width))
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
        newest = bin_ratio(tail)
        ratios = [*self.ratios, newest, *gap]
        ratio_runs = _with_point(self.ratio_runs, self.ratio_open, done, newest, 1.0)
        peak, p50_runs = None, []
        if self.bounds is not None:
            p50 = median(self.bounds, tail[2:])
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
    model's histories (the same lineage: a restarted history is a new one) stay the same.
    ``served`` is the counter role whose share is drawn (pagereader.CACHED: the effective
    ratio; "hits": the device's)."""

    def __init__(self, served: str = "hits") -> None:
        self.served = served
        self.lock = threading.Lock()
        self.width: float | None = None
        self.entries: dict[tuple[str, str], _Cached] = {}

    def chart(self, key: tuple[str, str], histories: Sequence[HistoryView], now: float,
              width: float) -> Chart:
        """The model's chart, computing only what the cache lacks (``histories``: the
        model's series as the target's latest view holds them)."""
        lo = math.floor(now / width) - BINS + 1
        newests = [h.held(0) for h in histories]
        newest = min((h[1] for h in newests if h is not None), default=None)
        cached = self.entries.get(key)
        if (newest is None or any(h is None or h[1] != newest for h in newests)
                or final_edge(newest, width) < lo):
            # Engines polled at different times, or nothing final yet: nothing to cache.
            self.entries.pop(key, None)
            return Chart.of(bin_history(histories, now, width, self.served))
        if cached is not None and cached.width == width \
                and cached.lineages == tuple(h.lineage for h in histories):
            # The same histories, a poll or more on: read on from their latest views.
            cached.series = [replace(s, history=h)
                             for s, h in zip(cached.series, histories, strict=True)]
        else:
            cached = None
        if cached is None or not cached.update(lo, newest):
            cached = _Cached([SeriesReader.of(h, width, self.served) for h in histories],
                             width, lo)
            cached.update(lo, newest)
            self.entries[key] = cached
        return cached.chart(now)
