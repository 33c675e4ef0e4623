"""What prefixwatch reads: metric names of each engine generation, by role."""

from __future__ import annotations

from dataclasses import dataclass

from prefixwatch.core import tiers

# --------------------------------------------------------------------------------------------
# What prefixwatch reads: one schema per engine generation
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceSchema:
    """Metric names of one engine generation, by the role they play for prefixwatch.

    Counter names are given as the sample names on the page (with ``_total``).
    ``detect`` is the sample name whose presence identifies the schema.
    """

    schema: str
    server: str
    detect: str
    queries: str | None = None
    hits: str | None = None
    ext_queries: str | None = None
    ext_hits: str | None = None
    prompt_tokens: str | None = None
    prompt_tokens_cached: str | None = None
    preemptions: str | None = None
    ttft: str | None = None  # histogram family name
    prompt_len: str | None = None  # histogram family name
    #: vLLM --kv-cache-metrics: idle time of cached blocks before eviction (histogram).
    kv_idle_evict: str | None = None
    kv_usage: str | None = None
    running: str | None = None
    waiting: str | None = None
    cache_config_info: str | None = None
    engine_reported_hit_ratio: str | None = None
    #: SGLang: counters by mode, used when the dedicated counters are missing.
    realtime_tokens: str | None = None
    windows_supported: bool = True
    note: str = ""
    #: Label holding the data-parallel engine index on this engine.
    engine_labels: tuple[str, ...] = ("engine",)
    #: Labels whose non-zero values repeat the same counter per rank (read rank 0 only).
    rank_labels: tuple[str, ...] = ()

    def counter_roles(self) -> dict[str, str]:
        """Role -> sample name, for the counters this schema has."""
        roles = ("queries", "hits", "ext_queries", "ext_hits", "prompt_tokens",
                 "prompt_tokens_cached", "preemptions")
        return {r: getattr(self, r) for r in roles if getattr(self, r)}

    def gauge_roles(self) -> dict[str, str]:
        roles = ("kv_usage", "running", "waiting", "engine_reported_hit_ratio")
        return {r: getattr(self, r) for r in roles if getattr(self, r)}

    def histogram_roles(self) -> dict[str, str]:
        return {r: getattr(self, r) for r in ("ttft", "prompt_len", "kv_idle_evict")
                if getattr(self, r)}

    def sample_names(self) -> frozenset[str]:
        """Every sample name this schema reads: the selective parser keeps only these."""
        names: set[str] = set(self.counter_roles().values())
        names |= {n.removesuffix("_total") + "_created" for n in self.counter_roles().values()}
        names |= set(self.gauge_roles().values())
        for h in self.histogram_roles().values():
            names |= {h + "_bucket", h + "_sum", h + "_count"}
        for extra in (self.cache_config_info, self.realtime_tokens, self.detect):
            if extra:
                names.add(extra)
        return frozenset(names)


VLLM_V1 = SourceSchema(
    schema="vllm_v1",
    server="vllm",
    detect="vllm:prefix_cache_queries_total",
    queries="vllm:prefix_cache_queries_total",
    hits="vllm:prefix_cache_hits_total",
    ext_queries="vllm:external_prefix_cache_queries_total",
    ext_hits="vllm:external_prefix_cache_hits_total",
    prompt_tokens="vllm:prompt_tokens_total",
    prompt_tokens_cached="vllm:prompt_tokens_cached_total",
    preemptions="vllm:num_preemptions_total",
    ttft="vllm:time_to_first_token_seconds",
    prompt_len="vllm:request_prompt_tokens",
    kv_idle_evict="vllm:kv_block_idle_before_evict_seconds",
    kv_usage="vllm:kv_cache_usage_perc",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    cache_config_info="vllm:cache_config_info",
)

VLLM_GPU_PREFIX = SourceSchema(
    schema="vllm_0.9",
    server="vllm",
    detect="vllm:gpu_prefix_cache_queries_total",
    queries="vllm:gpu_prefix_cache_queries_total",
    hits="vllm:gpu_prefix_cache_hits_total",
    prompt_tokens="vllm:prompt_tokens_total",
    preemptions="vllm:num_preemptions_total",
    ttft="vllm:time_to_first_token_seconds",
    prompt_len="vllm:request_prompt_tokens",
    kv_usage="vllm:gpu_cache_usage_perc",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    cache_config_info="vllm:cache_config_info",
    note="vLLM 0.9 to 0.11 names (gpu_prefix_cache_*, gpu_cache_usage_perc)",
)

VLLM_V0 = SourceSchema(
    schema="vllm_v0",
    server="vllm",
    detect="vllm:gpu_prefix_cache_hit_rate",
    engine_reported_hit_ratio="vllm:gpu_prefix_cache_hit_rate",
    prompt_tokens="vllm:prompt_tokens_total",
    preemptions="vllm:num_preemptions_total",
    ttft="vllm:time_to_first_token_seconds",
    prompt_len="vllm:request_prompt_tokens",
    kv_usage="vllm:gpu_cache_usage_perc",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    cache_config_info="vllm:cache_config_info",
    windows_supported=False,
    note="vLLM V0 only reports a lifetime hit-rate gauge: no window can be derived from it",
)

SGLANG = SourceSchema(
    schema="sglang",
    server="sglang",
    detect="sglang:prompt_tokens_total",
    queries="sglang:prompt_tokens_total",
    hits="sglang:cached_tokens_total",
    prompt_tokens="sglang:prompt_tokens_total",
    prompt_tokens_cached="sglang:cached_tokens_total",
    ttft="sglang:time_to_first_token_seconds",
    kv_usage="sglang:token_usage",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    engine_reported_hit_ratio="sglang:cache_hit_rate",
    realtime_tokens="sglang:realtime_tokens_total",
    engine_labels=("dp_rank",),
    rank_labels=("tp_rank", "pp_rank"),
    note="sglang:cache_hit_rate covers the last prefill batch only; windows use the counters",
)

#: Checked in this order: the first whose ``detect`` sample is on the page wins.
SCHEMAS: tuple[SourceSchema, ...] = (VLLM_V1, VLLM_GPU_PREFIX, SGLANG, VLLM_V0)

# SGLang's realtime_tokens_total modes that stand for prompt tokens computed and cached.
SGLANG_MODE_LABEL = "mode"
SGLANG_MODE_CACHED = "prefill_cache"
SGLANG_MODE_COMPUTED = "prefill_compute"

# Labels of vllm:cache_config_info that prefixwatch reads.
CACHE_INFO_BLOCK_SIZE = "block_size"
CACHE_INFO_ENABLED = "enable_prefix_caching"
CACHE_INFO_NUM_GPU_BLOCKS = "num_gpu_blocks"



# --------------------------------------------------------------------------------------------
# Cache tiers: the families that say which tier served a cached token (issue 13)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TierSchema:
    """What an engine exposes about its second (and further) cache tiers, by role.

    ``cached_by_source`` split by ``source_label`` gives cached tokens per engine source, to be
    mapped with ``core.tiers``; without it, ``fallback_device``/``fallback_unknown`` stand in
    (device = prefix-cache hits, unknown = external hits). ``tier_counters`` and
    ``tier_gauges`` are the tier's own bookkeeping (stores, loads, occupancy).
    """

    server: str
    cached_by_source: str
    source_label: str
    prompt_by_source: str | None = None
    fallback_device: str | None = None
    fallback_unknown: str | None = None
    ext_queries: str | None = None
    tier_counters: tuple[str, ...] = ()
    tier_gauges: tuple[str, ...] = ()
    info: str | None = None

    def sample_names(self) -> frozenset[str]:
        """Every sample name this schema reads (with the ``_created`` of each counter)."""
        counters = [n for n in (self.cached_by_source, self.prompt_by_source,
                                self.fallback_device, self.fallback_unknown, self.ext_queries,
                                *self.tier_counters) if n]
        names = set(counters) | {c.removesuffix("_total") + "_created" for c in counters}
        names |= set(self.tier_gauges)
        if self.info:
            names.add(self.info)
        return frozenset(names)


VLLM_TIERS = TierSchema(
    server="vllm",
    cached_by_source=tiers.VLLM_CACHED_BY_SOURCE,
    source_label=tiers.VLLM_SOURCE_LABEL,
    prompt_by_source=tiers.VLLM_PROMPT_BY_SOURCE,
    fallback_device=tiers.VLLM_DEVICE_HITS,
    fallback_unknown=tiers.VLLM_EXTERNAL_HITS,
    ext_queries=tiers.VLLM_EXTERNAL_QUERIES,
    tier_counters=(tiers.VLLM_OFFLOAD_SAVE_OUTCOMES, tiers.VLLM_OFFLOAD_LOAD_BLOCKS),
    tier_gauges=(tiers.VLLM_OFFLOAD_USED_BLOCKS, tiers.VLLM_OFFLOAD_PENDING_STORE_BLOCKS),
    info=tiers.VLLM_OFFLOAD_INFO,
)

SGLANG_TIERS = TierSchema(
    server="sglang",
    cached_by_source=tiers.SGLANG_CACHED_BY_SOURCE,
    source_label=tiers.SGLANG_SOURCE_LABEL,
    tier_counters=(tiers.SGLANG_EVICTED_TOKENS, tiers.SGLANG_LOAD_BACK_TOKENS,
                   tiers.SGLANG_HICACHE_BACKUP_TOKENS, tiers.SGLANG_HICACHE_DROPPED_TOKENS,
                   tiers.SGLANG_PREFETCHED_TOKENS, tiers.SGLANG_BACKUPED_TOKENS),
    tier_gauges=(tiers.SGLANG_HICACHE_HOST_USED, tiers.SGLANG_HICACHE_HOST_TOTAL),
)

#: Tier schema by server kind (``SourceSchema.server``).
TIER_SCHEMAS: dict[str, TierSchema] = {"vllm": VLLM_TIERS, "sglang": SGLANG_TIERS}
