"""Which cache tier served a prompt token: the engines' source labels mapped to ours.

A token loaded from host memory, a local disk or another instance is not recomputed, so the
question "how much prefill do we waste" needs every tier, not the device pool alone. The
engines name their tiers differently; prefixwatch normalises them to five:

* ``device``: the engine's own KV pool in accelerator memory (HBM);
* ``host``: offloaded to the same machine's DRAM (vLLM's CPU offload, SGLang HiCache L2);
* ``disk``: a local file tier (vLLM's disk backend, SGLang's ``file`` storage backend);
* ``remote``: another instance or a shared store (vLLM p2p, SGLang Mooncake, 3FS, NIXL...);
* ``unknown``: served by a connector that does not say from where.

Facts, with the source files they were checked against, are in docs/tiers.md.
"""

from __future__ import annotations

from collections.abc import Mapping

from prefixwatch.core.vocab import families
from prefixwatch.core.vocab.windows import ratio

TIER_DEVICE = "device"
TIER_HOST = "host"
TIER_DISK = "disk"
TIER_REMOTE = "remote"
TIER_UNKNOWN = "unknown"
#: Every tier, in the order a dashboard stacks them (fastest first).
TIERS: tuple[str, ...] = (TIER_DEVICE, TIER_HOST, TIER_DISK, TIER_REMOTE, TIER_UNKNOWN)

# -- vLLM 0.33 (V1 engine)
#: Cached prompt tokens by the tier that supplied them; sums to device + external hits.
VLLM_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
#: Every prompt token by where its KV came from: computed here, local cache, KV connector.
VLLM_PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
VLLM_SOURCE_LABEL = "source"
VLLM_CACHED_SOURCES: tuple[str, ...] = ("device", "host", "p2p", "disk", "external_unspecified")
VLLM_PROMPT_SOURCES: tuple[str, ...] = ("local_compute", "local_cache_hit",
                                        "external_kv_transfer")
#: prompt_tokens_by_source's source that was recomputed (no tier served it).
VLLM_PROMPT_SOURCE_COMPUTED = "local_compute"

_VLLM_TIER: dict[str, str] = {
    "device": TIER_DEVICE,
    "host": TIER_HOST,
    "disk": TIER_DISK,
    "p2p": TIER_REMOTE,
    "external_unspecified": TIER_UNKNOWN,
}

# SimpleCPUOffloadConnector (vllm/v1/simple_kv_offload/metrics.py), labels model_name, engine.
VLLM_OFFLOAD_SAVE_OUTCOMES = "vllm:simple_kv_offload_save_outcomes_total"
VLLM_OFFLOAD_LOAD_BLOCKS = "vllm:simple_kv_offload_load_blocks_total"
VLLM_OFFLOAD_USED_BLOCKS = "vllm:simple_kv_offload_used_blocks"
VLLM_OFFLOAD_PENDING_STORE_BLOCKS = "vllm:simple_kv_offload_pending_store_blocks"
VLLM_OFFLOAD_INFO = "vllm:simple_kv_offload_info"
VLLM_OFFLOAD_OUTCOME_LABEL = "outcome"
#: Store outcomes: one is success, two are "nothing to do", the rest lost a store.
VLLM_OFFLOAD_OUTCOME_STORED = "stored"
VLLM_OFFLOAD_OUTCOMES_SKIPPED: tuple[str, ...] = ("skipped_already_cached", "skipped_in_flight")
VLLM_OFFLOAD_OUTCOMES_FAILED: tuple[str, ...] = ("dropped_cpu_full", "dropped_request_gone",
                                                 "dropped_null_block", "dropped_not_hashed")

# -- SGLang (python/sglang/srt/observability/metrics_collector.py)
#: SGLang counts every tier in its cached-tokens counter (the hits role), split by source.
SGLANG_CACHED_BY_SOURCE = families.read("hits", families.SGLANG)
SGLANG_SOURCE_LABEL = "cache_source"
SGLANG_SOURCE_DEVICE = "device"
SGLANG_SOURCE_HOST = "host"
#: L3 hits are labelled ``storage_<backend>``; ``storage_unknown`` when the backend is unnamed.
SGLANG_STORAGE_PREFIX = "storage_"
#: Written when a request carries no per-source detail: cached tokens of no known tier.
SGLANG_SOURCE_TOTAL = "total"
#: SGLang's built-in HiCache storage backends (mem_cache/storage/backend_factory.py). Only
#: ``file`` writes to a local path; the others are remote stores or transfer engines.
SGLANG_STORAGE_BACKENDS: tuple[str, ...] = ("file", "sim", "nixl", "mooncake", "hf3fs",
                                            "aibrix", "eic", "simm", "mori", "shm", "kvcc")
SGLANG_LOCAL_DISK_BACKENDS: frozenset[str] = frozenset({"file"})

# HiCache families, each only on a server started with --enable-hierarchical-cache.
SGLANG_HICACHE_HOST_USED = "sglang:hicache_host_used_tokens"
SGLANG_HICACHE_HOST_TOTAL = "sglang:hicache_host_total_tokens"
SGLANG_EVICTED_TOKENS = "sglang:evicted_tokens_total"
SGLANG_LOAD_BACK_TOKENS = "sglang:load_back_tokens_total"  # label pool (kv, swa, mamba...)
SGLANG_HICACHE_BACKUP_TOKENS = "sglang:hicache_backup_tokens_total"  # device -> host, pool
SGLANG_HICACHE_DROPPED_TOKENS = "sglang:hicache_dropped_tokens_total"  # reason, pool
SGLANG_PREFETCHED_TOKENS = "sglang:prefetched_tokens_total"  # storage -> host (L3)
SGLANG_BACKUPED_TOKENS = "sglang:backuped_tokens_total"  # host -> storage (L3)


def vllm_source_tier(source: str) -> str:
    """The tier of one ``source`` value of vLLM's cached-by-source counter."""
    return _VLLM_TIER.get(source, TIER_UNKNOWN)


def sglang_source_tier(source: str) -> str:
    """The tier of one ``cache_source`` value of SGLang's cached-tokens counter."""
    if source == SGLANG_SOURCE_DEVICE:
        return TIER_DEVICE
    if source == SGLANG_SOURCE_HOST:
        return TIER_HOST
    if source.startswith(SGLANG_STORAGE_PREFIX):
        backend = source.removeprefix(SGLANG_STORAGE_PREFIX)
        if backend in SGLANG_LOCAL_DISK_BACKENDS:
            return TIER_DISK
        return TIER_UNKNOWN if backend in ("", "unknown") else TIER_REMOTE
    return TIER_UNKNOWN


def empty_tiers() -> dict[str, float]:
    """Every tier at zero: a tier that served nothing still has a series."""
    return dict.fromkeys(TIERS, 0.0)


def tiers_from_sources(by_source: Mapping[str, float], server: str) -> dict[str, float]:
    """Sum an engine's cached tokens by source into prefixwatch's tiers."""
    to_tier = vllm_source_tier if server == "vllm" else sglang_source_tier
    out = empty_tiers()
    for source, value in by_source.items():
        out[to_tier(source)] += value
    return out


def vllm_fallback_tiers(device_hits: float, external_hits: float | None) -> dict[str, float]:
    """Tiers of a vLLM page without the by-source counters (before vLLM 0.33): the device
    counter is the device tier, a connector's hits are of unknown tier."""
    out = empty_tiers()
    out[TIER_DEVICE] = device_hits
    out[TIER_UNKNOWN] = external_hits or 0.0
    return out


def effective_ratio(tiers: Mapping[str, float], prompt_tokens: float) -> float | None:
    """Share of prompt tokens served from any tier (core/windows.ratio); None without any."""
    return ratio(sum(tiers.values()), prompt_tokens)
