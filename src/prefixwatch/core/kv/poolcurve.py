"""The pool curve in numbers and in words: the hit ratio at each pool size, and what it says.

``core/kv/whatif.py`` counts, per replica, the prompt tokens a pool ``pool_scale`` times larger
would have served from what it evicted; over a window, beside the engine's prompt and cached
tokens (every tier), that is a curve: today's ratio at 1x, the what-if at 1.25, 1.5, 2 and 4x.
The words are the diagnosis' for the ``eviction_pressure`` question "would more memory fix it,
and how much?": the smallest pool that wins at least half of what 4x would, with the rest in
brackets, or, when 2x gains under ``FLAT_POINTS``, that memory would not help and where the
missed tokens went instead (the event ledger's largest other part).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prefixwatch.core.vocab import exposition

#: Under this gain at 2x the pool (in hit-ratio points, as a fraction), memory would not help.
FLAT_POINTS = 0.02
#: The pool scale the flat verdict quotes, and the ladder's capacity rung (core/kv/ladder.py).
FLAT_SCALE = "2"
LADDER_SCALE = "2"
#: The event ledger's parts other than eviction, as the verdict names them.
PART_WORDS: dict[str, str] = {
    "layout": "layout (a prompt-layout fix would share them)",
    "novel": "novel (no replica held them)",
    "routing": "routing (another replica held them)",
    exposition.LEDGER_TAIL: "tails shorter than a block (never cached)",
}


@dataclass(frozen=True)
class PoolCurve:
    """One window's curve: prompt tokens, today's hit ratio and each larger pool's."""

    prompt: int
    today: float
    whatif: dict[str, float]

    def points(self) -> list[tuple[float, float]]:
        """(pool multiple, hit ratio), today's first."""
        return [(1.0, self.today)] + [(float(s), r) for s, r in self.whatif.items()]

    def gain(self, scale: str) -> float:
        return self.whatif[scale] - self.today


def curve_of(prompt: float, cached: float, gained: Mapping[str, float]) -> PoolCurve | None:
    """The curve of a window's prompt and cached tokens and the what-if's gained tokens by
    scale (None without prompt tokens or without a what-if)."""
    if prompt <= 0 or not gained:
        return None
    return PoolCurve(round(prompt), min(cached / prompt, 1.0),
                     {s: min((cached + gained[s]) / prompt, 1.0)
                      for s in exposition.KV_WHATIF_POOL_SCALES if s in gained})


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _points(x: float) -> str:
    n = round(100 * x)
    return f"{n} point" if n == 1 else f"{n} points"


def verdict(curve: PoolCurve, parts: Mapping[str, float] | None = None) -> str:
    """The curve in one sentence. ``parts``: the event ledger's tokens by part over the same
    window (names the missed tokens when memory would not help)."""
    if FLAT_SCALE in curve.whatif and curve.gain(FLAT_SCALE) < FLAT_POINTS:
        gained = max(curve.gain(FLAT_SCALE), 0.0)
        text = f"more memory would not help: {FLAT_SCALE}x the pool gains {_points(gained)}"
        missed = {p: parts.get(p, 0) for p in PART_WORDS} if parts else {}
        if missed and max(missed.values()) > 0:
            top = max(missed, key=lambda p: missed[p])
            return f"{text}; the missed tokens are {PART_WORDS[top]}"
        return text
    scales = list(curve.whatif)
    best = curve.gain(scales[-1])
    pick = next(s for s in scales if curve.gain(s) >= best / 2)
    rest = ", ".join(f"{s}x: {_pct(curve.whatif[s])}" for s in scales if s != pick)
    return (f"with {pick}x the KV pool the hit ratio would have been "
            f"{_pct(curve.whatif[pick])} instead of {_pct(curve.today)} ({rest})")
