"""The names of prefixwatch's alerts and recording rules: written once, read by every product.

The mixin generates rules with these names; the demo, the report and the tests name them
without importing the mixin. Recorded series follow Prometheus' ``level:metric:operations``
convention; a window in a name (``rate5m``) is the window the rule computes over.
"""

from __future__ import annotations

ALERT_LOW = "PrefixCacheHitRateLow"
ALERT_REGRESSION = "PrefixCacheHitRateRegression"
ALERT_OUTLIER = "PrefixCacheReplicaOutlier"
ALERT_EVICTION = "PrefixCacheEvictionPressure"
ALERT_ABSENT = "PrefixCacheMetricsAbsent"
ALERT_WATCHDOG = "Watchdog"
# Cache tiers: a second tier that saves nothing, HBM outgrown, offload stores lost.
ALERT_TIER_IDLE = "PrefixCacheTierIdle"
ALERT_DEVICE_SHARE = "PrefixCacheDeviceShareLow"
ALERT_OFFLOAD_FAILURES = "PrefixCacheOffloadFailures"
# KV events (the exporter's mirror of each engine's event stream): why prompt tokens were
# computed, measured rather than replayed.
ALERT_KV_EVICTION = "PrefixCacheEvictionOfReusedContent"
ALERT_KV_ROUTING = "PrefixCacheRoutingWaste"
#: Matches every prefix-cache alert (not the Watchdog), for ALERTS{alertname=~...} queries.
ALERT_PATTERN = "PrefixCache.*"
#: The hit-rate alerts that a missing-metrics alert inhibits.
HIT_RATE_ALERTS = (ALERT_LOW, ALERT_REGRESSION, ALERT_OUTLIER)

#: Aggregation levels of recorded series.
MODEL = "model_name"
MODEL_TARGET = "model_name_target"


def r_queries(level: str, w: str) -> str:
    """Prompt tokens per second looked up in the prefix cache, over window ``w``."""
    return f"{level}:prefix_cache_queries:rate{w}"


def r_hits(level: str, w: str) -> str:
    """Prompt tokens per second served from the prefix cache, over window ``w``."""
    return f"{level}:prefix_cache_hits:rate{w}"


def r_ratio(level: str, w: str) -> str:
    """sum(rate(hits)) / sum(rate(queries)) at ``level``; absent without traffic."""
    return f"{level}:prefix_cache_hit_ratio:rate{w}"


# Cache tiers: prompt tokens by the tier that served them (device, host, disk, remote, unknown:
# core/vocab/tiers.py), the prompt tokens that looked up the cache, and what no tier served.
MODEL_TIER = "model_name_tier"
MODEL_TARGET_TIER = "model_name_target_tier"


def r_cached(level: str, w: str) -> str:
    """Prompt tokens per second served from any cache tier; by tier at a ``level`` ending in
    ``_tier``."""
    return f"{level}:prompt_tokens_cached:rate{w}"


def r_prompt(level: str, w: str) -> str:
    """Prompt tokens per second that looked up the cache (the effective ratio's denominator)."""
    return f"{level}:prompt_tokens:rate{w}"


def r_recomputed(level: str, w: str) -> str:
    """Prompt tokens per second that no tier served: prefilled from scratch."""
    return f"{level}:prompt_tokens_recomputed:rate{w}"


def r_effective(level: str, w: str) -> str:
    """Share of prompt tokens served from any tier; absent without traffic."""
    return f"{level}:prefix_cache_effective_hit_ratio:rate{w}"


def r_lower_tier(level: str, w: str) -> str:
    """Share of the device pool's misses that a lower tier (host, disk, remote) served."""
    return f"{level}:prefix_cache_lower_tier_hit_ratio:rate{w}"


def r_baseline(w: str, offset: str, effective: bool = False) -> str:
    """A model's device (or effective) ratio over ``w`` ending ``offset`` ago: the level a
    regression is judged against."""
    kind = "effective_hit_ratio" if effective else "hit_ratio"
    return f"{MODEL}:prefix_cache_{kind}:rate{w}_offset{offset}"


def r_tier_active(w: str) -> str:
    """Present per model while a second tier takes data (stores, occupancy, connector
    lookups) over ``w``."""
    return f"{MODEL}:prefix_cache_lower_tier_signals:count{w}"


def r_offload_failed(w: str) -> str:
    """Share of the offload connector's store decisions over ``w`` that lost the block."""
    return f"{MODEL_TARGET}:kv_offload_stores_failed:ratio_rate{w}"


R_RESETS = "model_name:prefix_cache_queries:resets"
R_TTFT = "model_name_quantile:time_to_first_token_seconds:rate5m"
R_TTFT_TARGET = "model_name_target_quantile:time_to_first_token_seconds:rate5m"
R_PROMPT_LEN = "model_name_quantile:request_prompt_tokens:rate5m"
R_KV = "model_name_target:kv_cache_usage:max5m"
R_PREEMPT = "model_name_target:preemptions:rate5m"
R_WAITING = "model_name_target:requests_waiting:max5m"
# Capacity and cost (the dashboard's arithmetic, recorded so it can be checked and reused).
R_SAVED_SHARE = "model_name:prefill_tokens_saved:ratio_rate5m"
R_ACHIEVABLE = "model_name:prefix_cache_achievable_hit_ratio:max"
R_MISSED = "model_name:prefill_tokens_achievable_missed:rate5m"
# The hit-rate ledger (the exporter with a request log): prompt tokens per second by
# part (achieved, novel, layout, routing, eviction, unexplained), and their shares of the
# prompt tokens, which sum to 1 per model.
R_LEDGER_TOKENS = "model_name:prefill_tokens_by_part:rate5m"
R_LEDGER_SHARE = "model_name:prefill_tokens_by_part:ratio_rate5m"

# KV events: prompt tokens computed per second by why (part: eviction, routing, layout, novel,
# and the tails shorter than a block), per model and per replica, and each part's share of the
# computed tokens.
MODEL_PART = "model_name_part"
MODEL_TARGET_PART = "model_name_target_part"


def r_kv_computed(level: str, w: str) -> str:
    """Device prompt tokens computed per second by part (KV events), over ``w``."""
    return f"{level}:kv_computed_tokens:rate{w}"


def r_kv_computed_share(level: str, w: str) -> str:
    """Each part's share of the computed tokens (sums to 1 per model, or model and replica)."""
    return f"{level}:kv_computed_tokens:ratio_rate{w}"


#: Device tokens a lower tier supplied (loaded, not computed), per model and medium.
R_KV_LOADED = "model_name_medium:kv_loaded_tokens:rate5m"
#: Blocks stored and removed (evicted) per second, per replica and medium.
R_KV_STORED = "target_medium:kv_blocks_stored:rate5m"
R_KV_REMOVED = "target_medium:kv_blocks_removed:rate5m"

#: Windows of the recorded fleet ratios (the critical and warning alerts' windows are recorded
#: whatever a config lists).
RATIO_WINDOWS = ("1m", "5m", "15m", "1h")
#: The window of the dashboards' and capacity rules' ratios: always recorded, for the fleet and
#: per replica (MixinConfig.target_windows adds the warning alerts').
REPLICA_WINDOW = "5m"

DEFAULT_RUNBOOK_URL = "https://github.com/prefixwatch/prefixwatch/blob/main/docs/runbooks.md"
#: Where an alert's runbook_url points: ``{anchor}`` is the section (lower-case alert name).
DEFAULT_RUNBOOK_URL_PATTERN = DEFAULT_RUNBOOK_URL + "#{anchor}"
