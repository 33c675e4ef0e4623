"""What is read across the targets' views: the diagnosis' evidence of each model of one target
over a window (deltas summed over engines before any ratio), the prompt tokens the targets
served (the ledger's achieved part), and what a surface says when there is no ledger."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from prefixwatch.core.diagnosis import TargetEvidence
from prefixwatch.core.vocab.windows import VectorLayout, histogram_quantile
from prefixwatch.exporter.monitor import (
    SeriesState,
    TargetView,
    WindowFigures,
    hist_delta,
    summed_delta,
    tier_sum,
)
from prefixwatch.exporter.pagereader import TIER_CONFIGURED, TIER_ROLES, TIER_STORES, TIER_USED

LEDGER_NEEDS_LOG = ("The ledger (where the missed prompt tokens went: novel, layout, routing, "
                    "eviction) needs a KV event stream (--kv-events ENDPOINT; "
                    "kv_events per target in the config file) or a request log "
                    "(requests_log in the config file; the exporter's --requests-log PATH): "
                    "docs/runbooks.md#the-hit-rate-ledger.")


def evidence_for(view: TargetView, now: float, window: float) -> dict[str, TargetEvidence]:
    """What the diagnosis needs of each model on one target, from its view."""
    by_model: dict[str, dict[tuple[str, str], SeriesState]] = {}
    for key, state in view.series.items():
        by_model.setdefault(key[0], {})[key] = state
    out: dict[str, TargetEvidence] = {}
    for model, keyed in by_model.items():
        states = list(keyed.values())
        ev = TargetEvidence()
        enabled = [s.values.caching_enabled for s in states if s.values.caching_enabled is not None]
        ev.caching_enabled = all(enabled) if enabled else None
        sizes = {s.values.block_size for s in states if s.values.block_size}
        ev.block_size = sizes.pop() if len(sizes) == 1 else None
        # The engine's own start time (the counters' _created) where it says it; else the
        # time the exporter saw its counters reset.
        starts = [created if (created := s.values.created.get("queries")) is not None
                  else view.last_reset.get(key) for key, s in keyed.items()]
        last_start = max((s for s in starts if s is not None), default=None)
        if last_start is not None:
            ev.seconds_since_start = now - last_start
        current = summed_delta(states, now, window)
        if current is not None:
            layout, _, vec = current
            ev.queries = vec[layout.offset_of("queries")]
            ev.hits = vec[layout.offset_of("hits")]
            _tier_evidence(ev, layout, vec)
            pre = vec[layout.offset_of("preemptions")]
            ev.preemptions = None if math.isnan(pre) else pre
            prompt = hist_delta(layout, vec, "prompt_len")
            if prompt is not None:
                ev.prompt_len = (prompt[0], prompt[1])
            ttft = hist_delta(layout, vec, "ttft")
            if ttft is not None:
                ev.ttft_requests = ttft[1][-1]
                ev.ttft_p50 = histogram_quantile(0.5, ttft[0], ttft[1])
            idle = hist_delta(layout, vec, "kv_idle_evict")
            if idle is not None:
                ev.evicted_blocks = idle[1][-1]
                ev.evict_idle_median = histogram_quantile(0.5, idle[0], idle[1])
        previous = summed_delta(states, now, window, older=window)
        if previous is not None:
            layout, _, vec = previous
            ev.prev_queries = vec[layout.offset_of("queries")]
            ev.prev_hits = vec[layout.offset_of("hits")]
            ttft = hist_delta(layout, vec, "ttft")
            if ttft is not None:
                ev.prev_ttft_requests = ttft[1][-1]
                ev.prev_ttft_p50 = histogram_quantile(0.5, ttft[0], ttft[1])
        if any(TIER_CONFIGURED in s.values.gauges for s in states):
            ev.tier_configured = True
        used = [s.values.gauges[TIER_USED] for s in states if TIER_USED in s.values.gauges]
        if used:
            ev.tier_used = sum(used)
        ring = [g for g in view.gauges.get(model, ()) if g[0] >= now - window - 1e-9]
        usage = [u for _, u, _ in ring if not math.isnan(u)]
        waiting = [w for _, _, w in ring if not math.isnan(w)]
        if usage:
            ev.kv_peak = max(usage)
        if waiting:
            ev.waiting_first, ev.waiting_last = waiting[0], waiting[-1]
            ev.waiting_mean = sum(waiting) / len(waiting)
        for attr in ("queries", "hits", "prev_queries", "prev_hits"):
            if math.isnan(getattr(ev, attr)):
                setattr(ev, attr, 0.0)
        out[model] = ev
    return out


def _tier_evidence(ev: TargetEvidence, layout: VectorLayout, vec: Sequence[float]) -> None:
    """The window's cached tokens of every tier, the second tier's stores, and whether a KV
    connector was asked for the device's misses (vLLM counts external queries only then)."""
    by_tier = tier_sum([{r: vec[layout.offset_of(r)] for r in TIER_ROLES.values()}])
    if by_tier:
        ev.tiers = by_tier
    stores = vec[layout.offset_of(TIER_STORES)]
    if not math.isnan(stores):
        ev.tier_stores = stores
    ext = vec[layout.offset_of("ext_queries")]
    if not math.isnan(ext):
        ev.tier_asked = ext
        if ext > 0:
            ev.tier_configured = True


def served_tokens(views: Iterable[TargetView], window: str, model: str | None = None
                  ) -> float | None:
    """Prompt tokens served from cache over a window, summed over the targets that are up
    (every tier; the device's hits where an engine shows no tiers): the ledger's achieved
    part. None when no target has the window, or a count is unknown."""
    figures = [f.windows[window] for view in views if view.up
               for m, f in view.models.items() if model in (None, m) and window in f.windows]
    if not figures:
        return None
    total = WindowFigures.summed(figures)
    served = total.cached if total.tiers else total.hits
    return None if math.isnan(served) else round(served)
