"""Small inline-SVG charts for the landing page: hit ratio and TTFT p50 over the last hour.

Read from the monitors' own counter history (never changed here): the cumulative vectors are
sampled at ``BINS + 1`` bin edges, the finest history tier that reaches back to each edge, so a
chart costs a few numpy operations per target whatever the poll rate, and the fleet's chart
is the sum of its targets' edge deltas (sum of hits over sum of queries, never a mean of ratios).
Every label value is escaped; nothing is fetched from outside.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from prefixwatch.core.windows import SeriesHistory

if TYPE_CHECKING:
    from prefixwatch.exporter.service import Exporter

SPAN_SECONDS = 3600.0
MIN_SPAN_SECONDS = 120.0
BINS = 48
WIDTH, HEIGHT, PAD = 360, 84, 4


@dataclass
class Binned:
    """Per bin: query and hit deltas, and TTFT bucket deltas (None without a histogram)."""

    start: float
    end: float
    queries: np.ndarray = field(default_factory=lambda: np.zeros(BINS))
    hits: np.ndarray = field(default_factory=lambda: np.zeros(BINS))
    ttft_bounds: np.ndarray | None = None
    ttft: np.ndarray | None = None  # BINS x buckets, cumulative counts per bin

    def add(self, other: Binned) -> None:
        self.queries = self.queries + other.queries
        self.hits = self.hits + other.hits
        if other.ttft is None:
            return
        if self.ttft is None:
            self.ttft_bounds, self.ttft = other.ttft_bounds, other.ttft.copy()
        elif np.array_equal(self.ttft_bounds, other.ttft_bounds):
            self.ttft += other.ttft

    def ratios(self) -> list[float | None]:
        return [h / q if q > 0 else None
                for q, h in zip(self.queries.tolist(), self.hits.tolist(), strict=True)]

    def ttft_p50(self) -> list[float | None] | None:
        if self.ttft is None or self.ttft_bounds is None:
            return None
        return [None if math.isnan(v) else v
                for v in quantile_rows(0.5, self.ttft_bounds, self.ttft).tolist()]


def quantile_rows(q: float, bounds: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """histogram_quantile (core/windows.py) on every row at once; NaN for an empty row."""
    total = counts[:, -1]
    rank = q * total
    idx = np.argmax(counts >= rank[:, None], axis=1)
    rows = np.arange(len(counts))
    lower = np.where(idx > 0, bounds[np.maximum(idx - 1, 0)], 0.0)
    below = np.where(idx > 0, counts[rows, np.maximum(idx - 1, 0)], 0.0)
    upper = bounds[idx]
    inside = counts[rows, idx] - below
    with np.errstate(divide="ignore", invalid="ignore"):
        value = np.where(inside > 0, lower + (upper - lower) * (rank - below) / inside, upper)
    value = np.where(np.isinf(upper), lower, value)
    return np.where(total > 0, value, np.nan)


def _at_edges(history: SeriesHistory, edges: np.ndarray, picks: np.ndarray) -> np.ndarray:
    """The cumulative values at ``picks`` as of each edge, from the finest history tier that
    reaches back to it (NaN before the history starts)."""
    out = np.full((len(edges), len(picks)), np.nan)
    todo = np.ones(len(edges), dtype=bool)
    for tier in history._tiers:  # read-only; finest first
        if not tier.times:
            continue
        want = todo & (edges >= tier.times[0])
        if not want.any():
            continue
        idx = np.searchsorted(np.asarray(tier.times), edges[want], side="right") - 1
        out[want] = np.asarray([tier.values[i] for i in idx.tolist()])[:, picks]
        todo &= ~want
    return out


def bin_history(histories: Sequence[SeriesHistory], now: float,
                span: float = SPAN_SECONDS) -> Binned:
    """One model's engines on one target, binned over (now - span, now]."""
    out = Binned(now - span, now)
    edges = np.linspace(now - span, now, BINS + 1)
    for history in histories:
        layout = history.layout
        picks = [layout.offset_of("queries"), layout.offset_of("hits")]
        spot = layout.histogram_slice("ttft")
        if spot is not None:
            offset, bounds = spot
            picks += range(offset + 2, offset + 2 + len(bounds))
        deltas = np.diff(_at_edges(history, edges, np.asarray(picks)), axis=0)
        deltas = np.where(np.isfinite(deltas) & (deltas >= 0), deltas, 0.0)
        part = Binned(out.start, out.end, deltas[:, 0], deltas[:, 1])
        if spot is not None:
            part.ttft_bounds, part.ttft = np.asarray(spot[1]), deltas[:, 2:]
        out.add(part)
    return out


#: Polyline coordinates are integers in tenths of a pixel (cheap to format), scaled back.
SCALE = 10
_X = [str(round((PAD + i * (WIDTH - 2 * PAD) / (BINS - 1)) * SCALE)) for i in range(BINS)]


def _points(values: Sequence[float | None], top: float) -> list[str]:
    """Polyline runs (a gap where a bin saw no traffic)."""
    runs, current = [], []
    base, height = (HEIGHT - PAD) * SCALE, (HEIGHT - 2 * PAD) * SCALE / top
    for i, v in enumerate(values):
        if v is None or v != v:
            if current:
                runs.append(" ".join(current))
                current = []
            continue
        current.append(f"{_X[i]},{round(base - height * min(v, top))}")
    if current:
        runs.append(" ".join(current))
    return runs


def svg_chart(binned: Binned, threshold: float, title: str) -> str:
    """One chart: hit ratio (blue, 0-100%), threshold (red dashes), TTFT p50 (orange, own
    scale, its peak written at the top right)."""
    ratios = binned.ratios()
    p50 = binned.ttft_p50()
    y_thr = HEIGHT - PAD - (HEIGHT - 2 * PAD) * threshold
    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
             f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img">'
             f"<title>{html.escape(title)}</title>"
             f'<rect x="0.5" y="0.5" width="{WIDTH - 1}" height="{HEIGHT - 1}" fill="#fff" '
             'stroke="#ddd"/>'
             f'<line x1="{PAD}" x2="{WIDTH - PAD}" y1="{y_thr:.1f}" y2="{y_thr:.1f}" '
             'stroke="#d62728" stroke-dasharray="5 3" stroke-width="1"/>']
    if p50 is not None:
        peak = max((v for v in p50 if v is not None), default=None)
        if peak:
            for run in _points(p50, peak * 1.1):
                parts.append(f'<polyline points="{run}" fill="none" stroke="#f16913" '
                             'stroke-width="12" transform="scale(0.1)"/>')
            label = f"{peak * 1000:.0f} ms" if peak < 1 else f"{peak:.1f} s"
            parts.append(f'<text x="{WIDTH - PAD - 2}" y="12" text-anchor="end" '
                         f'class="ttft">TTFT p50 peak {label}</text>')
    for run in _points(ratios, 1.0):
        parts.append(f'<polyline points="{run}" fill="none" stroke="#08519c" '
                     'stroke-width="20" transform="scale(0.1)"/>')
    parts.append("</svg>")
    return "".join(parts)


def current_ratio(binned: Binned) -> float | None:
    """The newest bin with traffic."""
    for q, h in zip(reversed(binned.queries.tolist()), reversed(binned.hits.tolist()),
                    strict=True):
        if q > 0:
            return h / q
    return None


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.3g} min" if seconds >= 120 else f"{seconds:.0f} s"


def _pct(value: float | None) -> str:
    return "no traffic" if value is None else f"{value:.1%}"


def charts_section(exporter: Exporter, now: float) -> str:
    """The landing page's charts: each model's fleet, then each target's, with its diagnosis."""
    threshold = exporter.config.thresholds.hit_ratio
    per_target: list[tuple[str, str, Binned]] = []
    fleet: dict[str, Binned] = {}
    latest = max((m.last_success for m in exporter.monitors if m.last_success == m.last_success),
                 default=now)
    span = SPAN_SECONDS
    oldest = latest
    for mon in exporter.monitors:
        with mon.lock:
            for state in mon.series.values():
                tiers = state.history._tiers if state.history is not None else []
                if tiers and tiers[-1].times:
                    oldest = min(oldest, tiers[-1].times[0])
    # A young exporter: its whole history across the chart, not an hour of mostly gaps.
    span = min(SPAN_SECONDS, max(MIN_SPAN_SECONDS, latest - oldest))
    for mon in exporter.monitors:
        with mon.lock:
            if not mon.up:
                continue
            by_model: dict[str, list[SeriesHistory]] = {}
            for (model, _engine), state in mon.series.items():
                if state.history is not None:
                    by_model.setdefault(model, []).append(state.history)
            binned = {m: bin_history(h, latest, span) for m, h in by_model.items()}
        for model, b in sorted(binned.items()):
            per_target.append((mon.name, model, b))
            fleet.setdefault(model, Binned(b.start, b.end)).add(b)
    with exporter.state.lock:
        active = {key: exporter.state.diagnosis.active(*key)
                  for key in exporter.state.diagnosis.causes}
    out = [f'<h2>Hit ratio over time</h2><p class="legend"><span style="color:#08519c">&#9644; hit '
           f'ratio</span> (0-100%) &middot; <span style="color:#d62728">- - threshold '
           f'{threshold:.0%}</span> &middot; <span style="color:#f16913">&#9644; TTFT p50'
           f"</span> (own scale) &middot; the last {_duration(span)}, one point per "
           f"{_duration(span / BINS)}; the page refreshes itself every 15 s</p>"]
    for model, b in sorted(fleet.items()):
        causes = sorted({c for (t, m), cs in active.items() if m == model for c in cs})
        out.append(_card("fleet", model, b, threshold, causes, fleet=True))
    out.append('<div class="cards">')
    for target, model, b in per_target:
        out.append(_card(target, model, b, threshold, active.get((target, model), [])))
    out.append("</div>")
    return "".join(out)


def _card(target: str, model: str, binned: Binned, threshold: float, causes: list[str],
          fleet: bool = False) -> str:
    esc = html.escape
    now = current_ratio(binned)
    low = now is not None and now < threshold
    title = f"{'fleet' if fleet else target}: {model}"
    diagnosis = ", ".join(causes) if causes else "no cause holds"
    return (f'<div class="card{" fleet" if fleet else ""}"><div class="head">'
            f"<b>{esc(target)}</b> &middot; {esc(model)} &middot; "
            f'<span class="{"low" if low else "ok"}">{_pct(now)}</span></div>'
            f"{svg_chart(binned, threshold, title)}"
            f'<div class="diag">diagnosis: {esc(diagnosis)}</div></div>')
