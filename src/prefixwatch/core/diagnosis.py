"""Why is the hit rate low: the runbook's causes, told apart by the traces each one leaves.

Pure functions over figures the exporter already has (one window of each target's counters,
gauges and histograms, and, when a requests log is read, what an unlimited cache would have
served). The rules and their thresholds are documented in docs/runbooks.md#diagnosis; the
numbers live in ``catalog.DiagnosisThresholds``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prefixwatch.core.cache.requestledger import Parts
from prefixwatch.core.vocab import exposition
from prefixwatch.core.vocab.causes import CAUSE_NAMES, DiagnosisThresholds
from prefixwatch.core.vocab.settings import DEFAULT_HIT_RATIO_MODE, HIT_RATIO_DEVICE
from prefixwatch.core.vocab.windows import histogram_quantile, ratio


@dataclass
class TargetEvidence:
    """One model on one target, over the diagnosis window (None: not known)."""

    queries: float = 0.0
    hits: float = 0.0
    prev_queries: float = 0.0
    prev_hits: float = 0.0
    caching_enabled: bool | None = None
    block_size: int | None = None
    kv_peak: float | None = None
    preemptions: float | None = None
    waiting_first: float | None = None
    waiting_last: float | None = None
    waiting_mean: float | None = None
    evicted_blocks: float | None = None
    evict_idle_median: float | None = None
    prompt_len: tuple[tuple[float, ...], list[float]] | None = None  # window deltas
    ttft_p50: float | None = None
    prev_ttft_p50: float | None = None
    ttft_requests: float = 0.0
    prev_ttft_requests: float = 0.0
    seconds_since_start: float | None = None
    #: Cached prompt tokens of the window by tier (core.tiers.TIERS); empty: not shown.
    tiers: dict[str, float] = field(default_factory=dict)
    #: A second tier exists (its families are on the page, or a KV connector was asked).
    tier_configured: bool = False
    tier_stores: float | None = None  # stored into the second tier in the window
    tier_used: float | None = None  # what the second tier holds now
    tier_asked: float | None = None  # vLLM: device misses a KV connector was asked for

    @property
    def hit_ratio(self) -> float | None:
        """The device pool's ratio, as the engine counts its hits."""
        return ratio(self.hits, self.queries)

    @property
    def cached(self) -> float:
        """Prompt tokens served from any tier (the device hits when no tier is shown)."""
        return sum(self.tiers.values()) if self.tiers else self.hits

    @property
    def lower_hits(self) -> float:
        """Prompt tokens a tier below the device pool served: misses it saved."""
        return max(self.cached - self.hits, 0.0)

    @property
    def effective_ratio(self) -> float | None:
        return ratio(self.cached, self.queries)

    def judged_ratio(self, mode: str) -> float | None:
        """The ratio the threshold judges: ``effective`` (any tier) or ``device``."""
        return self.hit_ratio if mode == HIT_RATIO_DEVICE else self.effective_ratio

    @property
    def prev_hit_ratio(self) -> float | None:
        return ratio(self.prev_hits, self.prev_queries)

    @property
    def requests(self) -> float:
        if self.prompt_len is None:
            return 0.0
        return self.prompt_len[1][-1]

    def short_share(self) -> float | None:
        """Share of the window's requests whose prompt fits in one block (can never hit)."""
        if self.prompt_len is None or self.block_size is None or not self.requests > 0:
            return None
        bounds, counts = self.prompt_len
        return fraction_at_or_below(self.block_size, bounds, counts) / self.requests

    def prompt_quantile(self, q: float) -> float | None:
        if self.prompt_len is None:
            return None
        return histogram_quantile(q, *self.prompt_len)


@dataclass
class RequestEvidence:
    """What the requests log says about the window: an unlimited cache's hit ratio."""

    requests: int = 0
    prompt_tokens: int = 0
    cacheable_tokens: int = 0
    long_requests: int = 0
    long_prompt_tokens: int = 0
    long_cacheable_tokens: int = 0
    #: The hit-rate ledger of the same requests (core/cache/requestledger.py), and the parts it
    #: cannot tell apart (they stay in ``unexplained``); None: no ledger (the rules of the
    #: achievable ratio alone apply).
    ledger: Parts | None = None
    ledger_unmeasured: tuple[str, ...] = ()

    @property
    def achievable(self) -> float | None:
        return ratio(self.cacheable_tokens, self.prompt_tokens)

    @property
    def achievable_long(self) -> float | None:
        return ratio(self.long_cacheable_tokens, self.long_prompt_tokens)


@dataclass
class Diagnosis:
    """Causes per (target, model); every cause present, True while it holds."""

    causes: dict[tuple[str, str], dict[str, bool]] = field(default_factory=dict)

    def active(self, target: str, model: str) -> list[str]:
        return [c for c, on in self.causes.get((target, model), {}).items() if on]


def fraction_at_or_below(x: float, bounds: tuple[float, ...], cumulative: list[float]) -> float:
    """Observations at or below x, interpolated linearly inside the bucket (as
    histogram_quantile does)."""
    below_bound, below_count = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if x <= bound:
            if math.isinf(bound) or bound == below_bound:
                return below_count
            return below_count + (count - below_count) * (x - below_bound) / (
                bound - below_bound)
        below_bound, below_count = bound, count
    return below_count


# -- one rule per cause --------------------------------------------------------------------------


def caching_disabled(ev: TargetEvidence) -> bool:
    return ev.caching_enabled is False


def metric_pressure(ev: TargetEvidence, th: DiagnosisThresholds) -> bool:
    """The pool is full and something shows it: preemptions, a queue that does not drain, or
    cached blocks evicted soon after their last use."""
    if ev.kv_peak is None or ev.kv_peak < th.kv_usage_high:
        return False
    if ev.preemptions is not None and ev.preemptions > 0:
        return True
    if (ev.waiting_mean is not None and ev.waiting_mean > 0 and ev.waiting_first is not None
            and ev.waiting_last is not None and ev.waiting_last >= ev.waiting_first
            and ev.waiting_last > 0):
        return True
    return bool(ev.evicted_blocks and ev.evict_idle_median is not None
                and ev.evict_idle_median < th.evict_idle_seconds)


def rescued(ev: TargetEvidence, th: DiagnosisThresholds, mode: str) -> bool:
    """A lower tier caught what the device pool lost, and the judged ratio is healthy: a
    full device pool is then not a low hit rate (its evictions were saved, not lost)."""
    judged = ev.judged_ratio(mode)
    return ev.lower_hits > 0 and judged is not None and judged >= th.hit_ratio


def tier_idle(ev: TargetEvidence, th: DiagnosisThresholds) -> bool:
    """A second tier that is fed (stores, data held, or asked for the device's misses) but
    serves under tier_idle_hit_share of those misses while the device ratio is low."""
    busy = any(x is not None and x > 0 for x in (ev.tier_stores, ev.tier_used, ev.tier_asked))
    device = ev.hit_ratio
    if not (ev.tier_configured and busy and ev.tiers) or device is None:
        return False
    if device >= th.hit_ratio or (ev.prompt_len is not None and ev.requests < th.min_requests):
        return False
    misses = ev.queries - ev.hits
    return misses > 0 and ev.lower_hits < th.tier_idle_hit_share * misses


def short_prompts(ev: TargetEvidence, th: DiagnosisThresholds) -> bool:
    share = ev.short_share()
    return share is not None and ev.requests >= th.min_requests and share >= th.short_prompt_share


def prompt_variance(ev: TargetEvidence, th: DiagnosisThresholds,
                    mode: str = DEFAULT_HIT_RATIO_MODE) -> bool:
    hit = ev.judged_ratio(mode)
    if hit is None or hit >= th.hit_ratio or ev.requests < th.min_requests:
        return False
    p50, p99 = ev.prompt_quantile(0.5), ev.prompt_quantile(0.99)
    return bool(p50 and p99 is not None and p99 >= th.prompt_variance_ratio * p50)


def cold_start(ev: TargetEvidence, cold_seconds: float) -> bool:
    return ev.seconds_since_start is not None and 0 <= ev.seconds_since_start < cold_seconds


def no_ttft_benefit(ev: TargetEvidence, th: DiagnosisThresholds) -> bool:
    now, before = ev.hit_ratio, ev.prev_hit_ratio
    if now is None or before is None or now - before < th.ttft_rise:
        return False
    if min(ev.ttft_requests, ev.prev_ttft_requests) < th.min_requests:
        return False
    if ev.ttft_p50 is None or ev.prev_ttft_p50 is None:
        return False
    return ev.ttft_p50 >= th.ttft_fall * ev.prev_ttft_p50


def prefix_divergence(req: RequestEvidence | None, th: DiagnosisThresholds,
                      missed: Mapping[str, float] | None = None) -> bool:
    """The prompts share too little: with the ledger's ``missed`` parts, novel + layout (of the
    prompts longer than one block) is above 1 - hit_ratio of their tokens and the largest
    missed part; without them, the achievable ratio of those prompts is below hit_ratio (the
    same number: the ledger's fleet reach is the achievable ratio)."""
    if req is None or req.long_requests < th.min_requests:
        return False
    if missed is not None:
        prefix = missed["prefix"]
        return prefix > (1 - th.hit_ratio) and prefix >= max(missed.values())
    value = req.achievable_long
    return value is not None and value < th.hit_ratio


def ledger_missed(req: RequestEvidence | None, achieved: float | None
                  ) -> dict[str, float] | None:
    """The window's missed prompt tokens by part, as shares of the tokens of the prompts
    longer than one block (a shorter prompt can never hit: all its tokens are novel and it
    has no other part): ``prefix`` (novel + layout), then ``routing``, ``eviction`` (0 when
    not measured) and ``unexplained`` (pool_reach - achieved, not below 0; 0 when the
    achieved tokens are not known). None without a ledger or without long prompts."""
    if req is None or req.ledger is None:
        return None
    parts = req.ledger
    short = req.prompt_tokens - req.long_prompt_tokens  # wholly novel
    tokens = parts.prompt - short
    if tokens <= 0 or parts.prompt != req.prompt_tokens:
        return None  # not the same requests: no ledger rather than a wrong one
    rest = 0.0 if achieved is None else max(parts.pool_reach - achieved, 0.0)
    return {"prefix": (parts.novel + parts.layout - short) / tokens,
            "routing": parts.routing / tokens, "eviction": parts.eviction / tokens,
            "unexplained": rest / tokens}


def diagnose(
    evidence: Mapping[str, Mapping[str, TargetEvidence]],
    requests: Mapping[str, RequestEvidence | None],
    th: DiagnosisThresholds,
    cold_seconds: float,
    hit_ratio_mode: str = DEFAULT_HIT_RATIO_MODE,
) -> Diagnosis:
    """``evidence``: target -> model -> figures; ``requests``: model -> requests-log figures;
    ``hit_ratio_mode``: which ratio the threshold judges (``effective`` or ``device``)."""
    out = Diagnosis()
    by_model: dict[str, dict[str, TargetEvidence]] = {}
    for target, models in evidence.items():
        for model, ev in models.items():
            by_model.setdefault(model, {})[target] = ev
    for model, targets in by_model.items():
        req = requests.get(model)
        missed = ledger_missed(req, _achieved(targets, hit_ratio_mode))
        per_target: dict[str, dict[str, bool]] = {}
        for target, ev in targets.items():
            causes = dict.fromkeys(CAUSE_NAMES, False)
            causes["caching_disabled"] = caching_disabled(ev)
            causes["eviction_pressure"] = (metric_pressure(ev, th)
                                           and not rescued(ev, th, hit_ratio_mode))
            causes["short_prompts"] = short_prompts(ev, th)
            causes["prompt_variance"] = prompt_variance(ev, th, hit_ratio_mode)
            causes["tier_idle"] = tier_idle(ev, th)
            causes["cold_start"] = cold_start(ev, cold_seconds)
            causes["no_ttft_benefit"] = no_ttft_benefit(ev, th)
            causes["prefix_divergence"] = prefix_divergence(req, th, missed)
            per_target[target] = causes
        _ledger_causes(targets, per_target, req, missed, th, hit_ratio_mode)
        _gap_causes(targets, per_target, req, th, hit_ratio_mode)
        for target, causes in per_target.items():
            out.causes[(target, model)] = causes
    return out


def _achieved(targets: Mapping[str, TargetEvidence], mode: str) -> float | None:
    """The window's cached prompt tokens of the model over its targets (every tier in
    effective mode); None when no target served a query."""
    serving = [ev for ev in targets.values() if ev.queries > 0]
    if not serving:
        return None
    return sum(ev.hits if mode == HIT_RATIO_DEVICE else ev.cached for ev in serving)


def _ledger_causes(targets: Mapping[str, TargetEvidence],
                   per_target: dict[str, dict[str, bool]], req: RequestEvidence | None,
                   missed: Mapping[str, float] | None, th: DiagnosisThresholds,
                   mode: str = DEFAULT_HIT_RATIO_MODE) -> None:
    """The ledger's measured parts: ``routing_spread`` while routing's share is routing_gap or
    more, ``eviction_pressure`` while eviction's is (the ledger is the model's, over the
    fleet: every serving target gets the cause). Not on a cold or caching-disabled target
    (those explain the misses), nor eviction where a lower tier rescued the ratio."""
    if missed is None or req is None or req.long_requests < th.min_requests:
        return
    serving = [t for t, ev in targets.items() if ev.queries > 0]
    if any(per_target[t]["caching_disabled"] or per_target[t]["cold_start"] for t in serving):
        return
    for part, cause in (("routing", "routing_spread"), ("eviction", "eviction_pressure")):
        if part in req.ledger_unmeasured or missed[part] < th.routing_gap:
            continue
        for t in serving:
            if cause != "eviction_pressure" or not rescued(targets[t], th, mode):
                per_target[t][cause] = True


def _gap_causes(targets: Mapping[str, TargetEvidence], per_target: dict[str, dict[str, bool]],
                req: RequestEvidence | None, th: DiagnosisThresholds,
                mode: str = DEFAULT_HIT_RATIO_MODE) -> None:
    """Achievable high, achieved low: the cache forgot (one replica) or the traffic is spread
    (several replicas, no pool under pressure). Achieved counts every tier in effective mode.
    Only for what the ledger cannot tell apart: a part it measures is judged on its share
    (``_ledger_causes``), never on the gap as well."""
    if req is None or req.long_requests < th.min_requests:
        return
    ledger = req.ledger is not None
    routing_known = ledger and "routing" not in req.ledger_unmeasured
    eviction_known = ledger and "eviction" not in req.ledger_unmeasured
    achievable = req.achievable
    serving = [t for t, ev in targets.items() if ev.queries > 0]
    if achievable is None or achievable < th.hit_ratio or not serving:
        return
    if any(per_target[t]["caching_disabled"] or per_target[t]["cold_start"] for t in serving):
        return  # those explain the gap already
    achieved = ratio(_achieved(targets, mode) or 0.0, sum(targets[t].queries for t in serving))
    if achieved is None or achievable - achieved < th.routing_gap:
        return
    if len(serving) == 1:
        if not eviction_known:
            per_target[serving[0]]["eviction_pressure"] = True
    elif not routing_known and not any(per_target[t]["eviction_pressure"] for t in serving):
        for t in serving:
            per_target[t]["routing_spread"] = True


def event_evidence(shares: Mapping[str, int], prompt: int, requests: int) -> RequestEvidence:
    """The event ledger of a window as the rules' request evidence: its parts are measured
    (eviction from the engine's own removals, routing from the other replicas' mirrors), the
    tails shorter than a block stand where short prompts stand (wholly novel, never cached)."""
    tail = shares.get(exposition.LEDGER_TAIL, 0)
    unshared = shares["novel"] + shares["layout"] + tail
    parts = Parts(prompt=prompt, novel=shares["novel"] + tail, layout=shares["layout"],
                  routing=shares["routing"], eviction=shares["eviction"],
                  pool_reach=shares["achieved"] + shares["unexplained"],
                  achieved=shares["achieved"], requests=requests)
    return RequestEvidence(
        requests=requests, prompt_tokens=prompt, cacheable_tokens=prompt - unshared,
        long_requests=requests, long_prompt_tokens=prompt - tail,
        long_cacheable_tokens=prompt - unshared, ledger=parts, ledger_unmeasured=())
