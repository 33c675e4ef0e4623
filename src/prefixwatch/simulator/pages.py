"""The engines' /metrics pages, family by family, as the simulator serves them."""

from __future__ import annotations

from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------
# The vLLM 0.33 (V1 engine) /metrics page, family by family.
# Copied from vLLM's own output (tests/fixtures/vllm_metrics.txt); the simulator serves exactly
# these families and a test compares them with the fixture line-family by line-family.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PageFamily:
    name: str  # as declared in client_python (counters without _total)
    kind: str
    help: str
    labels: tuple[str, ...] = ("model_name", "engine")
    #: One extra label and the values vLLM pre-initialises for it.
    preset: tuple[tuple[str, tuple[str, ...]], ...] = ()
    buckets: tuple[float, ...] = field(default=())
    #: Children appear on the first increment (as the engine's own), not at start-up.
    lazy: bool = False


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value``, as vLLM's build_1_2_5_buckets."""
    out: list[float] = []
    scale = 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(float(m * scale))
        scale *= 10


#: vLLM's bucket lists shared by several families (vllm/v1/metrics/loggers.py): token counts in
#: 1-2-5 steps up to max_model_len (32768 here), per-token and per-request seconds.
_TOKENS = buckets_1_2_5(32768)
_TOKEN_SECONDS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_REQUEST_SECONDS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

VLLM_V1_PAGE: tuple[PageFamily, ...] = (
    PageFamily('vllm:estimated_flops_per_gpu', 'counter',
               'Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).'),
    PageFamily('vllm:estimated_read_bytes_per_gpu', 'counter',
               'Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).'),
    PageFamily('vllm:estimated_write_bytes_per_gpu', 'counter',
               'Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).'),
    PageFamily('vllm:num_requests_running', 'gauge',
               'Number of requests in model execution batches.'),
    PageFamily('vllm:num_requests_waiting', 'gauge',
               'Number of requests waiting to be processed.'),
    PageFamily('vllm:num_requests_waiting_by_reason', 'gauge',
               "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.", preset=(('reason', ('capacity', 'deferred')),)),
    PageFamily('vllm:engine_sleep_state', 'gauge',
               'Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.', preset=(('sleep_state', ('awake', 'weights_offloaded', 'discard_all')),)),
    PageFamily('vllm:kv_cache_usage_perc', 'gauge',
               'KV-cache usage. 1 means 100 percent usage.'),
    PageFamily('vllm:prefix_cache_queries', 'counter',
               'Prefix cache queries, in terms of number of queried tokens.'),
    PageFamily('vllm:prefix_cache_hits', 'counter',
               'Prefix cache hits, in terms of number of cached tokens.'),
    PageFamily('vllm:external_prefix_cache_queries', 'counter',
               'External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.'),
    PageFamily('vllm:external_prefix_cache_hits', 'counter',
               'External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.'),
    PageFamily('vllm:mm_cache_queries', 'counter',
               'Multi-modal cache queries, in terms of number of queried items.'),
    PageFamily('vllm:mm_cache_hits', 'counter',
               'Multi-modal cache hits, in terms of number of cached items.'),
    PageFamily('vllm:num_preemptions', 'counter',
               'Cumulative number of preemption from the engine.'),
    PageFamily('vllm:prompt_tokens', 'counter',
               'Number of prefill tokens processed.'),
    PageFamily('vllm:prompt_tokens_by_source', 'counter',
               'Number of prompt tokens by source.', preset=(('source', ('local_compute', 'local_cache_hit', 'external_kv_transfer')),)),
    PageFamily('vllm:prompt_tokens_cached', 'counter',
               'Number of cached prompt tokens (local + external).'),
    PageFamily('vllm:prompt_tokens_cached_by_source', 'counter',
               'Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.', preset=(('source', ('device', 'host', 'p2p', 'disk', 'external_unspecified')),)),
    PageFamily('vllm:generation_tokens', 'counter',
               'Number of generation tokens processed.'),
    PageFamily('vllm:request_success', 'counter',
               'Count of successfully processed requests.', preset=(('finished_reason', ('stop', 'length', 'abort', 'error', 'repetition')),)),
    PageFamily('vllm:admission_rejections', 'counter',
               'Number of admission attempts rejected by a queue limit, by reason.', labels=('model_name',), preset=(('reason', ('max_num_queued_reqs', 'max_num_queued_tokens')),)),
    PageFamily('vllm:request_prompt_tokens', 'histogram',
               'Number of prefill tokens processed.', buckets=_TOKENS),
    PageFamily('vllm:request_generation_tokens', 'histogram',
               'Number of generation tokens processed.', buckets=_TOKENS),
    PageFamily('vllm:iteration_tokens_total', 'histogram',
               'Histogram of number of tokens per engine_step.', buckets=(1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)),
    PageFamily('vllm:request_max_num_generation_tokens', 'histogram',
               'Histogram of maximum number of requested generation tokens.', buckets=_TOKENS),
    PageFamily('vllm:request_params_n', 'histogram',
               'Histogram of the n request parameter.', buckets=(1.0, 2.0, 5.0, 10.0, 20.0)),
    PageFamily('vllm:request_params_max_tokens', 'histogram',
               'Histogram of the max_tokens request parameter.', buckets=_TOKENS),
    PageFamily('vllm:time_to_first_token_seconds', 'histogram',
               'Histogram of time to first token in seconds.', buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)),
    PageFamily('vllm:inter_token_latency_seconds', 'histogram',
               'Histogram of inter-token latency in seconds.', buckets=_TOKEN_SECONDS),
    PageFamily('vllm:request_time_per_output_token_seconds', 'histogram',
               'Histogram of time_per_output_token_seconds per request.', buckets=_TOKEN_SECONDS),
    PageFamily('vllm:e2e_request_latency_seconds', 'histogram',
               'Histogram of e2e request latency in seconds.', buckets=_REQUEST_SECONDS),
    PageFamily('vllm:request_queue_time_seconds', 'histogram',
               'Histogram of time spent in WAITING phase for request.', buckets=_REQUEST_SECONDS),
    PageFamily('vllm:request_inference_time_seconds', 'histogram',
               'Histogram of time spent in RUNNING phase for request.', buckets=_REQUEST_SECONDS),
    PageFamily('vllm:request_prefill_time_seconds', 'histogram',
               'Histogram of time spent in PREFILL phase for request.', buckets=_REQUEST_SECONDS),
    PageFamily('vllm:request_decode_time_seconds', 'histogram',
               'Histogram of time spent in DECODE phase for request.', buckets=_REQUEST_SECONDS),
    PageFamily('vllm:request_num_preemptions', 'histogram',
               'Histogram of the number of times a request was preempted.', buckets=(1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)),
    PageFamily('vllm:request_prefill_kv_computed_tokens', 'histogram',
               'Histogram of new KV tokens computed during prefill (excluding cached tokens).', buckets=_TOKENS),
    PageFamily('vllm:cache_config_info', 'gauge',
               'Information of the LLMEngine CacheConfig', labels=('engine',)),
)

#: Histograms whose buckets vLLM builds as 1-2-5 steps up to max_model_len
#: (build_1_2_5_buckets in vllm/v1/metrics/loggers.py); the table above has max_model_len 32768.
VLLM_MAX_MODEL_LEN_BUCKETS = frozenset({
    "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
    "vllm:request_max_num_generation_tokens", "vllm:request_params_max_tokens",
    "vllm:request_prefill_kv_computed_tokens"})


#: With ``--kv-cache-metrics`` vLLM adds these block-residency histograms (sampled blocks,
#: ``--kv-cache-metrics-sample``), from vllm/v1/metrics/loggers.py.
KV_RESIDENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
                        10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)
VLLM_KV_CACHE_METRICS_PAGE: tuple[PageFamily, ...] = (
    PageFamily(
        "vllm:kv_block_lifetime_seconds", "histogram",
        "Histogram of KV cache block lifetime from allocation to eviction. Sampled metrics "
        "(controlled by --kv-cache-metrics-sample).", buckets=KV_RESIDENCY_BUCKETS),
    PageFamily(
        "vllm:kv_block_idle_before_evict_seconds", "histogram",
        "Histogram of idle time before KV cache block eviction. Sampled metrics (controlled "
        "by --kv-cache-metrics-sample).", buckets=KV_RESIDENCY_BUCKETS),
    PageFamily(
        "vllm:kv_block_reuse_gap_seconds", "histogram",
        "Histogram of time gaps between consecutive KV cache block accesses. Only the most "
        "recent accesses are recorded (ring buffer). Sampled metrics (controlled by "
        "--kv-cache-metrics-sample).", buckets=KV_RESIDENCY_BUCKETS),
)

#: Labels vLLM 0.33 puts on vllm:cache_config_info, in order, with the values it wrote for the
#: fixture; the simulator fills block_size, num_gpu_blocks and enable_prefix_caching itself.
VLLM_CACHE_CONFIG_INFO = "vllm:cache_config_info"
VLLM_CACHE_CONFIG_DEFAULTS: tuple[tuple[str, str], ...] = (
    ("_block_size_resolved", "True"),
    ("block_size", "16"),
    ("cache_dtype", "auto"),
    ("cache_hit_alignment_tokens", "None"),
    ("effective_attention_block_size", "None"),
    ("enable_mamba_shared_prefix_checkpoint", "False"),
    ("enable_prefix_caching", "True"),
    ("gpu_memory_utilization", "0.92"),
    ("hash_block_size", "None"),
    ("is_attention_free", "False"),
    ("kv_cache_dtype_skip_layers", "[]"),
    ("kv_cache_layout", "None"),
    ("kv_cache_max_concurrency", "None"),
    ("kv_cache_memory_bytes", "None"),
    ("kv_cache_size_tokens", "None"),
    ("kv_offloading_backend", "native"),
    ("kv_offloading_size", "None"),
    ("kv_sharing_fast_prefill", "False"),
    ("mamba_block_size", "None"),
    ("mamba_cache_dtype", "auto"),
    ("mamba_cache_mode", "none"),
    ("mamba_page_size_padded", "None"),
    ("mamba_ssm_cache_dtype", "float32"),
    ("num_cpu_blocks", "None"),
    ("num_gpu_blocks", "420"),
    ("num_gpu_blocks_override", "None"),
    ("prefix_cache_retention_interval", "0"),
    ("prefix_caching_hash_algo", "sha256"),
    ("prefix_match_unit", "None"),
    ("replayssm_buffer_len", "16"),
    ("simple_cpu_offload_num_blocks", "None"),
    ("skip_page_size_padded", "None"),
    ("sliding_window", "None"),
    ("swa_bounded_replay", "True"),
    ("use_kda_recoverssm", "False"),
    ("use_replayssm", "False"),
    ("user_specified_block_size", "True"),
)

#: The SGLang families the simulator serves with ``--engine sglang`` (SGLang's own names and
#: HELP texts, from its docs/references/production_metrics.md).
SGLANG_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                       2.5, 5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0)
SGLANG_PAGE: tuple[PageFamily, ...] = (
    PageFamily("sglang:prompt_tokens", "counter", "Number of prefill tokens processed.",
               labels=("model_name",)),
    PageFamily("sglang:generation_tokens", "counter", "Number of generation tokens processed.",
               labels=("model_name",)),
    PageFamily("sglang:cached_tokens", "counter",
               "Number of cached prompt tokens by source (device/host/storage).",
               labels=("model_name", "cache_source"), lazy=True),
    PageFamily("sglang:num_requests", "counter", "Number of requests processed.",
               labels=("model_name",)),
    PageFamily("sglang:num_running_reqs", "gauge", "The number of running requests.",
               labels=("model_name",)),
    PageFamily("sglang:num_queue_reqs", "gauge",
               "The number of requests in the waiting queue.", labels=("model_name",)),
    PageFamily("sglang:token_usage", "gauge", "The token usage.", labels=("model_name",)),
    PageFamily("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.",
               labels=("model_name",)),
    PageFamily("sglang:time_to_first_token_seconds", "histogram",
               "Histogram of time to first token in seconds.", labels=("model_name",),
               buckets=SGLANG_TTFT_BUCKETS),
)


# --------------------------------------------------------------------------------------------
# A host tier: vLLM 0.33 with SimpleCPUOffloadConnector, SGLang with HiCache.
# From tests/fixtures/vllm_metrics_cpu_offload.txt and vllm/v1/simple_kv_offload/metrics.py;
# SGLang's from python/sglang/srt/observability/metrics_collector.py.
# --------------------------------------------------------------------------------------------

#: The connector's families, registered before the engine's (first on vLLM's page).
VLLM_SIMPLE_OFFLOAD_PAGE: tuple[PageFamily, ...] = (
    PageFamily(
        "vllm:simple_kv_offload_save_outcomes", "counter",
        "Store admission decisions in SimpleCPUOffloadConnector, by outcome. Outcomes classify "
        "eager-mode boundary hand-off stores; lazy-mode stores are not classified.",
        labels=("model_name", "engine", "outcome"), lazy=True),
    PageFamily(
        "vllm:simple_kv_offload_load_blocks", "counter",
        "KV blocks restored to GPU from the offload pool, counted when a load finishes. This is "
        "prefill work avoided through offload cache hits.", lazy=True),
    PageFamily(
        "vllm:simple_kv_offload_used_blocks", "gauge",
        "Offload-pool blocks currently pinned by in-flight transfers or cache hits (capacity "
        "minus free). Evictable cached blocks are not counted; capacity_blocks is on "
        "vllm:simple_kv_offload_info."),
    PageFamily(
        "vllm:simple_kv_offload_pending_store_blocks", "gauge",
        "Offload blocks in pending stores: queued for dispatch, issued to workers, or awaiting "
        "release after a cache reset. A persistently growing value indicates a stuck "
        "transfer."),
    PageFamily(
        "vllm:simple_kv_offload_info", "gauge",
        "SimpleCPUOffloadConnector deployment facts. Value is always 1. backend is cpu or disk; "
        "page_cache and lazy_offload are true/false; capacity_blocks is the offload pool size.",
        labels=("model_name", "engine", "backend", "page_cache", "lazy_offload",
                "capacity_blocks"), lazy=True),
)
VLLM_OFFLOAD_INFO = "vllm:simple_kv_offload_info"

#: With any KV connector vLLM adds this gauge right after num_requests_waiting_by_reason.
VLLM_KV_CONNECTOR_PAGE: tuple[PageFamily, ...] = (
    PageFamily(
        "vllm:num_requests_kv_fetch_by_stage", "gauge",
        "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = "
        "needs an async KV load that has not started; 'in_progress' = load started and not yet "
        "reported finished; 'completed_waiting' = load finished, request not running yet.",
        preset=(("stage", ("waiting_to_start", "in_progress", "completed_waiting")),)),
)
VLLM_KV_CONNECTOR_AFTER = "vllm:num_requests_waiting_by_reason"

#: Scheduler and radix-cache collectors' labels, and the values of a single-GPU server.
SGLANG_SCHEDULER_LABELS: tuple[tuple[str, str], ...] = (
    ("engine_type", "unified"), ("tp_rank", "0"), ("pp_rank", "0"), ("moe_ep_rank", "0"))
_SCHED = ("model_name", *(k for k, _ in SGLANG_SCHEDULER_LABELS))

#: HiCache families, only on a server started with --enable-hierarchical-cache.
SGLANG_HICACHE_PAGE: tuple[PageFamily, ...] = (
    PageFamily("sglang:hicache_host_used_tokens", "gauge",
               "Number of tokens currently used in the host KV cache.", labels=_SCHED,
               lazy=True),
    PageFamily("sglang:hicache_host_total_tokens", "gauge",
               "Total capacity of the host KV cache in tokens.", labels=_SCHED, lazy=True),
    PageFamily("sglang:evicted_tokens", "counter",
               "The number of device KV token slots freed by eviction, regardless of whether "
               "the data was backed up to host (see sglang:hicache_backup_tokens_total) or "
               "destroyed (see sglang:hicache_dropped_tokens_total).", labels=_SCHED,
               lazy=True),
    PageFamily("sglang:load_back_tokens", "counter",
               "The number of tokens loaded back from local host DRAM (L2) to GPU, by host "
               "pool (kv, swa, mamba, ...).", labels=(*_SCHED, "pool"), lazy=True),
    PageFamily("sglang:hicache_backup_tokens", "counter",
               "The number of tokens backed up from GPU to local host DRAM (L2), by host pool "
               "(kv, swa, mamba, ...). Covers all D->H backups regardless of "
               "--hicache-write-policy. Distinct from the host-to-storage (L3) "
               "sglang:backuped_tokens_total.", labels=(*_SCHED, "pool"), lazy=True),
)
