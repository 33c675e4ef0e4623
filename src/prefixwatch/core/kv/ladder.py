"""The ladder: a model's hit ratio as delivered, then with each fix the ledger names added.

The KV event ledger splits a span's prompt tokens into what the engines served from cache
(``achieved``) and why the rest was computed (``routing``: another replica held it;
``eviction``: the replica held it and evicted it; ``layout``: the same text after a short
divergence; ``novel``, the tails). Each rung adds one part back, in the order a fleet can fix
them: ``delivered`` (achieved), ``perfect_routing`` (+ routing: a prefix-aware router),
``capacity`` (+ what a KV pool ``LADDER_SCALE`` times larger would have kept, as the pool
what-if measures it, core/kv/whatif.py; absent without that measure), ``ideal_prompts``
(+ layout: the varying part moved below the shared one). The rungs are shares of the same
prompt tokens, so the step between two rungs is what that fix is worth, in hit ratio.
"""

from __future__ import annotations

from collections.abc import Mapping

from prefixwatch.core.kv.poolcurve import LADDER_SCALE

DELIVERED = "delivered"
PERFECT_ROUTING = "perfect_routing"
CAPACITY = "capacity"
IDEAL_PROMPTS = "ideal_prompts"
RUNGS: tuple[str, ...] = (DELIVERED, PERFECT_ROUTING, CAPACITY, IDEAL_PROMPTS)
#: How each rung is said on the landing page, in status and the report.
WORDS = {DELIVERED: "delivered", PERFECT_ROUTING: "with perfect routing",
         CAPACITY: f"with {LADDER_SCALE}x the KV pool (the what-if)",
         IDEAL_PROMPTS: "with ideal prompts (layout fixed)"}


def ladder(shares: Mapping[str, float], prompt: float,
           capacity_tokens: float | None = None) -> dict[str, float]:
    """The rungs as hit ratios of ``prompt`` tokens, from the ledger's ``shares`` (tokens by
    part); ``capacity_tokens``: prompt tokens a larger pool would have served beyond the
    engines' (None: not measured, no capacity rung). Empty without prompt tokens."""
    if prompt <= 0:
        return {}
    delivered = shares.get("achieved", 0.0) / prompt
    step = delivered + shares.get("routing", 0.0) / prompt
    out = {DELIVERED: delivered, PERFECT_ROUTING: step}
    if capacity_tokens is not None:
        step += max(capacity_tokens, 0.0) / prompt
        out[CAPACITY] = step
    out[IDEAL_PROMPTS] = step + shares.get("layout", 0.0) / prompt
    return {rung: min(value, 1.0) for rung, value in out.items()}


def lines(rungs: Mapping[str, float]) -> list[str]:
    """The ladder as text, each rung with what its fix adds ('+29.1 points')."""
    out = []
    before = None
    for rung in RUNGS:
        if rung not in rungs:
            continue
        value = rungs[rung]
        gain = "" if before is None else f"  (+{100 * (value - before):.1f} points)"
        out.append(f"{WORDS[rung]:<40} {value:6.1%}{gain}")
        before = value
    return out
