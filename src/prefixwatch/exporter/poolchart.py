"""The landing page's pool curve: each model's hit ratio against its KV pool size, today's point
marked, and the sentence that reads it (core/kv/poolcurve.py).

Self-contained: ``pool_curve_svg`` draws one curve, ``pool_section`` the page's section from the
exporter's event ledgers (empty when no stream has a what-if yet).
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

from prefixwatch.core.kv.poolcurve import PoolCurve

if TYPE_CHECKING:
    from prefixwatch.exporter.landing import LandingInputs

WIDTH, HEIGHT = 420, 210
_LEFT, _RIGHT, _TOP, _BOTTOM = 44, 16, 22, 40
#: The x axis: pool multiples (logarithmic: 1x to 4x), and its ticks.
_TICKS = (1.0, 1.25, 1.5, 2.0, 4.0)


def _x(multiple: float) -> float:
    import math

    span = WIDTH - _LEFT - _RIGHT
    return _LEFT + span * math.log(multiple) / math.log(_TICKS[-1])


def _y(ratio: float) -> float:
    return _TOP + (HEIGHT - _TOP - _BOTTOM) * (1.0 - ratio)


def pool_curve_svg(curve: PoolCurve, title: str) -> str:
    """One curve as an SVG: hit ratio (0-100%) against the pool multiple, today's point (1x)
    marked and labelled."""
    points = curve.points()
    path = " ".join(f"{'M' if i == 0 else 'L'}{_x(m):.1f},{_y(r):.1f}"
                    for i, (m, r) in enumerate(points))
    parts = [f'<svg class="poolcurve" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
             f'height="{HEIGHT}" role="img" aria-label="{html.escape(title)}">',
             f'<text x="{_LEFT}" y="14" font-size="12">{html.escape(title)}</text>']
    for tick in (0.0, 0.5, 1.0):
        y = _y(tick)
        parts.append(f'<line x1="{_LEFT}" x2="{WIDTH - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#ddd"/>'
                     f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" font-size="10" '
                     f'text-anchor="end">{tick:.0%}</text>')
    for tick in _TICKS:
        x = _x(tick)
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 24}" font-size="10" '
                     f'text-anchor="middle">{tick:g}x</text>')
    parts.append(f'<text x="{(WIDTH + _LEFT) / 2:.0f}" y="{HEIGHT - 6}" font-size="10" '
                 'text-anchor="middle">KV pool (multiple of today\'s)</text>')
    parts.append(f'<path d="{path}" fill="none" stroke="#1f77b4" stroke-width="2"/>')
    for m, r in points[1:]:
        parts.append(f'<circle cx="{_x(m):.1f}" cy="{_y(r):.1f}" r="3" fill="#1f77b4">'
                     f'<title>{m:g}x: {r:.1%}</title></circle>')
    x0, y0 = _x(1.0), _y(curve.today)
    label_y = y0 + 16 if curve.today >= 0.5 else y0 - 8  # off the curve, off the ticks
    parts.append(f'<circle cx="{x0:.1f}" cy="{y0:.1f}" r="5" fill="#d62728">'
                 f'<title>today: {curve.today:.1%}</title></circle>'
                 f'<text x="{x0 + 8:.1f}" y="{label_y:.1f}" font-size="11" fill="#d62728">'
                 f'today {curve.today:.0%}</text>')
    return "".join(parts) + "</svg>"


def pool_section(page: LandingInputs, window: str | None) -> str:
    """"How much memory would win it back": each model's curve over ``window`` (the event
    ledgers' samples) and its sentence; empty without a what-if."""
    ledgers = page.event_ledgers
    if ledgers is None:
        return ""
    seconds = page.config.window_seconds.get(window or "", page.diag_seconds)
    out = []
    for model in sorted(ledgers.models()):
        got = ledgers.whatif.model_curve(model, seconds)
        if got is None:
            continue
        curve, words = got
        out.append(f"<h3>{html.escape(model)}</h3><p class='verdict'>{html.escape(words)}</p>"
                   + pool_curve_svg(curve, f"hit ratio by KV pool size ({window}, "
                                           f"{curve.prompt:,} prompt tokens)"))
    if not out:
        return ""
    return (f"<h2>How much memory would win it back ({html.escape(str(window))}, from the KV "
            "event streams; docs/runbooks.md#eviction_pressure)</h2>" + "".join(out))
