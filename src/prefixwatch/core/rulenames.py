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
ALERTS = (ALERT_LOW, ALERT_REGRESSION, ALERT_OUTLIER, ALERT_EVICTION, ALERT_ABSENT,
          ALERT_WATCHDOG)
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


R_BASELINE = "model_name:prefix_cache_hit_ratio:rate2h_offset1h"
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

#: Windows of the recorded fleet ratios (the alerts read 1m, 5m and 15m).
RATIO_WINDOWS = ("1m", "5m", "15m", "1h")
#: The windows the alerts need: a config may add ratio windows, never drop these.
ALERT_RATIO_WINDOWS = ("1m", "5m", "15m")
#: Windows of the recorded per-replica ratios.
TARGET_WINDOWS = ("5m", "15m")

DEFAULT_RUNBOOK_URL = "https://github.com/prefixwatch/prefixwatch/blob/main/docs/runbooks.md"
#: Where an alert's runbook_url points: ``{anchor}`` is the section (lower-case alert name).
DEFAULT_RUNBOOK_URL_PATTERN = DEFAULT_RUNBOOK_URL + "#{anchor}"
