"""What prefixwatch reads: metric names of each engine generation, by role."""

from __future__ import annotations

from dataclasses import dataclass

from prefixwatch.core.vocab import families, tiers


@dataclass(frozen=True)
class SourceSchema:
    """One engine generation: how to recognise its page and read its labels. What it reads,
    by role, is the family table's (core/vocab/families.py) column for ``schema``.

    ``detect`` is the sample name whose presence identifies the schema.
    """

    schema: str
    server: str
    detect: str
    cache_config_info: str | None = None
    #: SGLang: counters by mode, used when the dedicated counters are missing.
    realtime_tokens: str | None = None
    windows_supported: bool = True
    note: str = ""
    #: Label holding the data-parallel engine index on this engine.
    engine_labels: tuple[str, ...] = ("engine",)
    #: Labels whose non-zero values repeat the same counter per rank (read rank 0 only).
    rank_labels: tuple[str, ...] = ()

    def read(self, role: str) -> str | None:
        """The sample this generation holds for a role (None: it has none)."""
        return families.BY_ROLE[role].read_on(self.schema)

    def roles(self, kind: str) -> dict[str, str]:
        """Role -> sample name, for the roles of one kind (counter, gauge, histogram)."""
        return {r: families.read(r, self.schema) for r in families.roles(kind, self.schema)}

    def sample_names(self) -> frozenset[str]:
        """Every sample name this schema reads: the selective parser keeps only these."""
        counters = self.roles("counter").values()
        names: set[str] = set(counters)
        names |= {n.removesuffix("_total") + "_created" for n in counters}
        names |= set(self.roles("gauge").values())
        for h in self.roles("histogram").values():
            names |= {h + "_bucket", h + "_sum", h + "_count"}
        names |= {n for n in (self.cache_config_info, self.realtime_tokens, self.detect) if n}
        return frozenset(names)


VLLM_V1 = SourceSchema(
    schema=families.VLLM_V1,
    server="vllm",
    detect=families.read("queries", families.VLLM_V1),
    cache_config_info="vllm:cache_config_info",
)

VLLM_GPU_PREFIX = SourceSchema(
    schema=families.VLLM_09,
    server="vllm",
    detect=families.read("queries", families.VLLM_09),
    cache_config_info="vllm:cache_config_info",
    note="vLLM 0.9 to 0.11 names (gpu_prefix_cache_*, gpu_cache_usage_perc)",
)

VLLM_V0 = SourceSchema(
    schema=families.VLLM_V0,
    server="vllm",
    detect=families.read("engine_reported_hit_ratio", families.VLLM_V0),
    cache_config_info="vllm:cache_config_info",
    windows_supported=False,
    note="vLLM V0 only reports a lifetime hit-rate gauge: no window can be derived from it",
)

SGLANG = SourceSchema(
    schema=families.SGLANG,
    server="sglang",
    detect=families.read("prompt_tokens", families.SGLANG),
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
    fallback_device: str | None = None
    fallback_unknown: str | None = None
    ext_queries: str | None = None
    tier_counters: tuple[str, ...] = ()
    tier_gauges: tuple[str, ...] = ()
    info: str | None = None

    def sample_names(self) -> frozenset[str]:
        """Every sample name this schema reads (with the ``_created`` of each counter)."""
        counters = [n for n in (self.cached_by_source,
                                self.fallback_device, self.fallback_unknown, self.ext_queries,
                                *self.tier_counters) if n]
        names = set(counters) | {c.removesuffix("_total") + "_created" for c in counters}
        return frozenset(names | set(self.tier_gauges) | ({self.info} if self.info else set()))


VLLM_TIERS = TierSchema(
    server="vllm",
    cached_by_source=tiers.VLLM_CACHED_BY_SOURCE,
    source_label=tiers.VLLM_SOURCE_LABEL,
    fallback_device=families.read("hits", families.VLLM_V1),
    fallback_unknown=families.read("ext_hits", families.VLLM_V1),
    ext_queries=families.read("ext_queries", families.VLLM_V1),
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
