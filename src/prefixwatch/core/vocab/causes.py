"""The causes of a low hit rate and the thresholds of the rules that detect them."""

from __future__ import annotations

from dataclasses import dataclass

from prefixwatch.core.vocab.exposition import DEFAULT_HIT_RATIO_THRESHOLD


@dataclass(frozen=True)
class Cause:
    """One cause of a low hit rate, with the rule that detects it (documented in the runbook)."""

    name: str
    summary: str
    rule: str


CAUSES: tuple[Cause, ...] = (
    Cause("caching_disabled", "prefix caching is switched off",
          "vllm:cache_config_info says enable_prefix_caching=False."),
    Cause("eviction_pressure", "the KV pool is full and evicts cached prefixes",
          "KV usage peaked at or above kv_usage_high in the window and requests were preempted, "
          "or requests kept waiting, or (--kv-cache-metrics) cached blocks were evicted after "
          "less than evict_idle_seconds idle; or, with a requests log, the ledger's eviction "
          "part is routing_gap or more of the prompt tokens (without the pool size: a single "
          "replica's achieved ratio is routing_gap or more below the achievable one). A lower "
          "tier's hits "
          "count as saved: not when a second tier served tokens and the judged hit ratio "
          "(hit_ratio: effective) is at or above the threshold."),
    Cause("short_prompts", "most prompts are shorter than one KV block",
          "At least short_prompt_share of the window's requests have a prompt of at most one "
          "block (from the prompt-length histogram)."),
    Cause("prompt_variance", "prompt lengths vary so much that little can be shared",
          "The hit ratio is below the threshold and the prompt-length p99 is at least "
          "prompt_variance_ratio times the p50 (min_requests or more requests)."),
    Cause("cold_start", "the server (re)started recently: the cache is cold",
          "The counters were created or reset less than cold_start ago."),
    Cause("prefix_divergence", "prompts differ near the top: no cache could serve them",
          "From the requests log: the ledger's novel + layout parts of the prompts longer than "
          "one block are more than 1 - hit_ratio of their tokens (their achievable ratio is "
          "below the threshold) and the largest missed part (min_requests or more requests)."),
    Cause("routing_spread", "requests of one prefix are spread over several replicas",
          "From the requests log: the ledger's routing part is routing_gap or more of the "
          "prompt tokens; without a replica per request, several replicas serve the model, the "
          "fleet's achieved ratio is routing_gap or more below the achievable one, and no "
          "replica shows eviction_pressure."),
    Cause("no_ttft_benefit", "the hit rate rose but TTFT did not fall",
          "The hit ratio of the window is ttft_rise or more above the window before it, and "
          "the TTFT p50 is not below ttft_fall times the previous one."),
    Cause("tier_idle", "a second cache tier stores prefixes but serves almost none",
          "A second tier is configured and busy (it received stores, holds data, or a KV "
          "connector was asked for the device's misses), the device ratio is below the "
          "threshold, and the lower tiers served less than tier_idle_hit_share of the device's "
          "misses (min_requests or more requests)."),
)
CAUSE_NAMES: tuple[str, ...] = tuple(c.name for c in CAUSES)

DIAGNOSIS_WINDOW = "5m"
COLD_START = "10m"


@dataclass(frozen=True)
class DiagnosisThresholds:
    """Every number the diagnosis rules use; overridable under ``diagnosis:`` in the config."""

    hit_ratio: float = DEFAULT_HIT_RATIO_THRESHOLD
    #: The KV-usage level of eviction pressure: the top-level ``kv_usage_high`` of either
    #: config file, the same number the PrefixCacheEvictionPressure alert judges.
    kv_usage_high: float = 0.90
    evict_idle_seconds: float = 60.0
    short_prompt_share: float = 0.5
    prompt_variance_ratio: float = 10.0
    min_requests: int = 20
    routing_gap: float = 0.20
    ttft_rise: float = 0.20
    ttft_fall: float = 0.95
    tier_idle_hit_share: float = 0.05


