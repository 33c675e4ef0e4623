"""The one place that names every metric prefixwatch reads or writes.

The exporter, the simulator, and (later) the rule and dashboard generators import these names;
nothing else in the project spells a metric name. Defaults for windows and thresholds live
here too, so the alert that pages and the panel that explains it agree on what "low" means.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# --------------------------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------------------------

#: Port of the exporter's own /metrics. Chosen outside the exporter range that Prometheus'
#: default-port-allocations wiki hands out to other exporters (see docs/configuration.md).
DEFAULT_PORT = 10089
DEFAULT_LISTEN_ADDRESS = f"0.0.0.0:{DEFAULT_PORT}"
DEFAULT_TARGET = "http://localhost:8000/metrics"
DEFAULT_INTERVAL_SECONDS = 5.0
DEFAULT_TIMEOUT_SECONDS = 3.0
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
#: Windows over which the exporter derives hit ratios and TTFT quantiles.
DEFAULT_WINDOWS: tuple[str, ...] = ("1m", "5m", "15m", "1h")
LIFETIME_WINDOW = "lifetime"
TTFT_QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
#: A model's hit rate below this pages (alerting issue); the dashboards colour against it.
DEFAULT_HIT_RATIO_THRESHOLD = 0.70

# Environment variables the exporter reads when no flag is given.
ENV_TARGETS = "PREFIXWATCH_TARGETS"
ENV_CONFIG = "PREFIXWATCH_CONFIG"

# --------------------------------------------------------------------------------------------
# What prefixwatch exposes (no colons: colons are reserved for recording rules)
# --------------------------------------------------------------------------------------------

PREFIX = "prefixwatch_"

# Label names of our own series.
L_TARGET = "target"
L_MODEL = "model_name"
L_ENGINE = "engine"
L_SERVER = "server"
L_WINDOW = "window"
L_QUANTILE = "quantile"
L_REASON = "reason"
L_SCHEMA = "schema"
L_SOURCE = "source"


@dataclass(frozen=True)
class OutMetric:
    """One series family that the exporter writes."""

    name: str  # without the _total suffix for counters (client_python adds it)
    kind: str  # counter | gauge | histogram | info
    help: str
    labels: tuple[str, ...]
    #: For info metrics: the keys of the info value (client_python adds them as labels).
    info_keys: tuple[str, ...] = ()


_SERIES = (L_TARGET, L_MODEL, L_ENGINE, L_SERVER)

OUT_QUERIES = OutMetric(
    "prefixwatch_prefix_cache_queries", "counter",
    "Prompt tokens looked up in the prefix cache, as the engine counts them.", _SERIES)
OUT_HITS = OutMetric(
    "prefixwatch_prefix_cache_hits", "counter",
    "Prompt tokens served from the prefix cache, as the engine counts them.", _SERIES)
OUT_EXT_QUERIES = OutMetric(
    "prefixwatch_external_prefix_cache_queries", "counter",
    "Prompt tokens looked up in an external (KV connector) cache.", _SERIES)
OUT_EXT_HITS = OutMetric(
    "prefixwatch_external_prefix_cache_hits", "counter",
    "Prompt tokens served from an external (KV connector) cache.", _SERIES)
OUT_PROMPT_TOKENS = OutMetric(
    "prefixwatch_prompt_tokens", "counter",
    "Prompt (prefill) tokens processed.", _SERIES)
OUT_PROMPT_TOKENS_CACHED = OutMetric(
    "prefixwatch_prompt_tokens_cached", "counter",
    "Prompt tokens served from any cache (local and external).", _SERIES)
OUT_PREEMPTIONS = OutMetric(
    "prefixwatch_preemptions", "counter",
    "Requests preempted because the KV-cache pool was full.", _SERIES)
OUT_TTFT = OutMetric(
    "prefixwatch_time_to_first_token_seconds", "histogram",
    "Time to first token, re-exposed with the engine's own buckets.", _SERIES)
OUT_PROMPT_LEN = OutMetric(
    "prefixwatch_request_prompt_tokens", "histogram",
    "Prompt length per request, re-exposed with the engine's own buckets.", _SERIES)
OUT_KV_USAGE = OutMetric(
    "prefixwatch_kv_cache_usage_ratio", "gauge",
    "Share of the KV-cache pool in use (1 = full).", _SERIES)
OUT_RUNNING = OutMetric(
    "prefixwatch_requests_running", "gauge", "Requests in the running batch.", _SERIES)
OUT_WAITING = OutMetric(
    "prefixwatch_requests_waiting", "gauge", "Requests waiting to be scheduled.", _SERIES)
OUT_BLOCK_SIZE = OutMetric(
    "prefixwatch_cache_block_size_tokens", "gauge",
    "Tokens per KV-cache block; prompts shorter than one block can never hit.", _SERIES)
OUT_CACHING_ENABLED = OutMetric(
    "prefixwatch_prefix_caching_enabled", "gauge",
    "1 when the engine reports prefix caching switched on, 0 when off.", _SERIES)
OUT_ENGINE_REPORTED = OutMetric(
    "prefixwatch_engine_reported_hit_ratio", "gauge",
    "Hit ratio as the engine reports it itself (vLLM V0 gauge, SGLang last-batch gauge). "
    "Not windowed: no time window can be derived from it.",
    (L_TARGET, L_MODEL, L_ENGINE, L_SERVER, L_SOURCE))

OUT_HIT_RATIO = OutMetric(
    "prefixwatch_prefix_cache_hit_ratio", "gauge",
    "Prefix-cache hit ratio of one target and model over a window: "
    "delta(hits)/delta(queries), reset-safe; absent when the window saw no queries.",
    (L_TARGET, L_MODEL, L_SERVER, L_WINDOW))
OUT_FLEET_HIT_RATIO = OutMetric(
    "prefixwatch_fleet_prefix_cache_hit_ratio", "gauge",
    "Prefix-cache hit ratio of a model over all targets: sum of hits over sum of queries "
    "(never an average of ratios); absent when the window saw no queries.",
    (L_MODEL, L_WINDOW))
OUT_CACHED_TOKENS_RATE = OutMetric(
    "prefixwatch_prefix_cache_hit_tokens_per_second", "gauge",
    "Prompt tokens per second served from the prefix cache over a window (prefill work saved).",
    (L_TARGET, L_MODEL, L_SERVER, L_WINDOW))
OUT_QUERY_RATE = OutMetric(
    "prefixwatch_prefix_cache_query_tokens_per_second", "gauge",
    "Prompt tokens per second looked up in the prefix cache over a window.",
    (L_TARGET, L_MODEL, L_SERVER, L_WINDOW))
OUT_TTFT_QUANTILE = OutMetric(
    "prefixwatch_time_to_first_token_quantile_seconds", "gauge",
    "TTFT quantile over a window, from histogram bucket deltas (linear interpolation, as "
    "histogram_quantile); absent when the window saw no requests.",
    (L_TARGET, L_MODEL, L_SERVER, L_WINDOW, L_QUANTILE))

OUT_TARGET_UP = OutMetric(
    "prefixwatch_target_up", "gauge",
    "1 when the last poll of the target succeeded, 0 otherwise.", (L_TARGET,))
OUT_TARGET_INFO = OutMetric(
    "prefixwatch_target", "info",
    "Engine kind and metric schema detected on the target.", (L_TARGET,),
    info_keys=(L_SERVER, L_SCHEMA))
OUT_SCRAPE_DURATION = OutMetric(
    "prefixwatch_scrape_duration_seconds", "gauge",
    "Seconds the last poll of the target took.", (L_TARGET,))
OUT_SCRAPE_ERRORS = OutMetric(
    "prefixwatch_scrape_errors", "counter",
    "Failed polls of the target, by reason.", (L_TARGET, L_REASON))
OUT_LAST_SUCCESS = OutMetric(
    "prefixwatch_last_successful_scrape_timestamp_seconds", "gauge",
    "Unix time of the last successful poll of the target.", (L_TARGET,))
OUT_ROUND_DURATION = OutMetric(
    "prefixwatch_poll_round_duration_seconds", "gauge",
    "Seconds the last round of polling all targets took; keep it under the interval.", ())
OUT_BUILD_INFO = OutMetric(
    "prefixwatch_build", "info", "prefixwatch version and Python version.", (),
    info_keys=("version", "python"))

# -- Diagnosis: why the hit rate is low ------------------------------------------------------

L_CAUSE = "cause"
L_KIND = "kind"
L_RESULT = "result"

OUT_DIAGNOSIS = OutMetric(
    "prefixwatch_diagnosis", "gauge",
    "1 while a cause of a low hit rate holds for the target and model, 0 otherwise; every "
    "cause is always present (rules in docs/runbooks.md#diagnosis).",
    (L_TARGET, L_MODEL, L_CAUSE))
OUT_ACHIEVABLE = OutMetric(
    "prefixwatch_achievable_hit_ratio", "gauge",
    "Hit ratio an unlimited prefix cache would reach on the logged requests of the window "
    "(vLLM's rule: whole blocks, n-1 cap); absent without a requests log or traffic.",
    (L_MODEL, L_WINDOW))
OUT_DIVERGENCE = OutMetric(
    "prefixwatch_prefix_divergence_tokens", "histogram",
    "Token position where a logged request stops matching the closest earlier request.",
    (L_MODEL,))
OUT_DIVERGENCE_KIND = OutMetric(
    "prefixwatch_prefix_divergence_requests", "gauge",
    "Logged requests of the window that diverge early, by what varies there (never the text).",
    (L_MODEL, L_WINDOW, L_KIND))
OUT_DIVERGENCE_TOP_KIND = OutMetric(
    "prefixwatch_prefix_divergence_top_kind", "gauge",
    "1 on the most frequent divergence kind of the window.", (L_MODEL, L_WINDOW, L_KIND))
OUT_REQUESTS_LOG_LINES = OutMetric(
    "prefixwatch_requests_log_lines", "counter",
    "Lines read from the requests log, by result (request, truncated, skipped, other).",
    (L_RESULT,))
OUT_REQUESTS_WINDOW = OutMetric(
    "prefixwatch_requests_window_requests", "gauge",
    "Requests held in the sliding window of the request-level view.", ())
OUT_REQUESTS_WINDOW_BLOCKS = OutMetric(
    "prefixwatch_requests_window_blocks", "gauge",
    "Distinct KV blocks held by the sliding window (its memory is proportional to this).", ())


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
          "KV usage peaked at or above kv_usage_full in the window and requests were preempted, "
          "or requests kept waiting, or (--kv-cache-metrics) cached blocks were evicted after "
          "less than evict_idle_seconds idle; or, with a requests log and a single replica, the "
          "achieved ratio is routing_gap or more below the achievable one."),
    Cause("short_prompts", "most prompts are shorter than one KV block",
          "At least short_prompt_share of the window's requests have a prompt of at most one "
          "block (from the prompt-length histogram)."),
    Cause("prompt_variance", "prompt lengths vary so much that little can be shared",
          "The hit ratio is below the threshold and the prompt-length p99 is at least "
          "prompt_variance_ratio times the p50 (min_requests or more requests)."),
    Cause("cold_start", "the server (re)started recently: the cache is cold",
          "The counters were created or reset less than cold_start ago."),
    Cause("prefix_divergence", "prompts differ near the top: no cache could serve them",
          "From the requests log: the achievable ratio of prompts longer than one block is below "
          "the threshold (min_requests or more requests)."),
    Cause("routing_spread", "requests of one prefix are spread over several replicas",
          "From the requests log: several replicas serve the model, the fleet's achieved ratio "
          "is routing_gap or more below the achievable one, and no replica shows "
          "eviction_pressure."),
    Cause("no_ttft_benefit", "the hit rate rose but TTFT did not fall",
          "The hit ratio of the window is ttft_rise or more above the window before it, and "
          "the TTFT p50 is not below ttft_fall times the previous one."),
)
CAUSE_NAMES: tuple[str, ...] = tuple(c.name for c in CAUSES)

#: What varies where requests diverge (the audit's kinds); "unknown" without a decoder.
DIVERGENCE_KINDS: tuple[str, ...] = ("date/time", "id", "key order", "number", "name", "text",
                                     "unknown")
#: Buckets of the divergence-position histogram, in tokens.
DIVERGENCE_BUCKETS: tuple[float, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                         16384, 32768)
REQUESTS_LOG_RESULTS: tuple[str, ...] = ("request", "truncated", "skipped", "other")

DIAGNOSIS_WINDOW = "5m"
COLD_START = "10m"
#: Sliding window of the request-level view: at most this many requests and blocks.
REQUESTS_WINDOW_REQUESTS = 4096
REQUESTS_WINDOW_BLOCKS = 262_144


@dataclass(frozen=True)
class DiagnosisThresholds:
    """Every number the diagnosis rules use; overridable under ``diagnosis:`` in the config."""

    hit_ratio: float = DEFAULT_HIT_RATIO_THRESHOLD
    kv_usage_full: float = 0.90
    evict_idle_seconds: float = 60.0
    short_prompt_share: float = 0.5
    prompt_variance_ratio: float = 10.0
    min_requests: int = 20
    routing_gap: float = 0.20
    ttft_rise: float = 0.20
    ttft_fall: float = 0.95


#: Reasons a poll fails; every one is pre-initialised to 0 for every target.
SCRAPE_ERROR_REASONS: tuple[str, ...] = (
    "connect",        # connection refused, DNS, reset
    "timeout",        # no complete answer within the target's timeout
    "tls",            # certificate or handshake failure
    "http_status",    # a status other than 200
    "too_large",      # the body passed the size cap
    "not_metrics",    # HTML error page, or a page without any known engine family
    "parse",          # malformed or truncated exposition, duplicate series
    "invalid_value",  # NaN or negative counter
)

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



VLLM_V1_PAGE: tuple[PageFamily, ...] = (
    PageFamily(
        'vllm:estimated_flops_per_gpu', 'counter',
        'Estimated number of floating point operations per GPU (for Model Flops Utilization calculations).',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:estimated_read_bytes_per_gpu', 'counter',
        'Estimated number of bytes read from memory per GPU (for Model Flops Utilization calculations).',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:estimated_write_bytes_per_gpu', 'counter',
        'Estimated number of bytes written to memory per GPU (for Model Flops Utilization calculations).',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:num_requests_running', 'gauge',
        'Number of requests in model execution batches.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:num_requests_waiting', 'gauge',
        'Number of requests waiting to be processed.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:num_requests_waiting_by_reason', 'gauge',
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        labels=('model_name', 'engine'),
        preset=(('reason', ('capacity', 'deferred')),)),
    PageFamily(
        'vllm:engine_sleep_state', 'gauge',
        'Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.',
        labels=('model_name', 'engine'),
        preset=(('sleep_state', ('awake', 'weights_offloaded', 'discard_all')),)),
    PageFamily(
        'vllm:kv_cache_usage_perc', 'gauge',
        'KV-cache usage. 1 means 100 percent usage.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:prefix_cache_queries', 'counter',
        'Prefix cache queries, in terms of number of queried tokens.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:prefix_cache_hits', 'counter',
        'Prefix cache hits, in terms of number of cached tokens.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:external_prefix_cache_queries', 'counter',
        'External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:external_prefix_cache_hits', 'counter',
        'External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:mm_cache_queries', 'counter',
        'Multi-modal cache queries, in terms of number of queried items.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:mm_cache_hits', 'counter',
        'Multi-modal cache hits, in terms of number of cached items.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:num_preemptions', 'counter',
        'Cumulative number of preemption from the engine.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:prompt_tokens', 'counter',
        'Number of prefill tokens processed.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:prompt_tokens_by_source', 'counter',
        'Number of prompt tokens by source.',
        labels=('model_name', 'engine'),
        preset=(('source', ('local_compute', 'local_cache_hit', 'external_kv_transfer')),)),
    PageFamily(
        'vllm:prompt_tokens_cached', 'counter',
        'Number of cached prompt tokens (local + external).',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:prompt_tokens_cached_by_source', 'counter',
        'Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.',
        labels=('model_name', 'engine'),
        preset=(('source', ('device', 'host', 'p2p', 'disk', 'external_unspecified')),)),
    PageFamily(
        'vllm:generation_tokens', 'counter',
        'Number of generation tokens processed.',
        labels=('model_name', 'engine')),
    PageFamily(
        'vllm:request_success', 'counter',
        'Count of successfully processed requests.',
        labels=('model_name', 'engine'),
        preset=(('finished_reason', ('stop', 'length', 'abort', 'error', 'repetition')),)),
    PageFamily(
        'vllm:admission_rejections', 'counter',
        'Number of admission attempts rejected by a queue limit, by reason.',
        labels=('model_name',),
        preset=(('reason', ('max_num_queued_reqs', 'max_num_queued_tokens')),)),
    PageFamily(
        'vllm:request_prompt_tokens', 'histogram',
        'Number of prefill tokens processed.',
        labels=('model_name', 'engine'),
        buckets=(1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0)),
    PageFamily(
        'vllm:request_generation_tokens', 'histogram',
        'Number of generation tokens processed.',
        labels=('model_name', 'engine'),
        buckets=(1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0)),
    PageFamily(
        'vllm:iteration_tokens_total', 'histogram',
        'Histogram of number of tokens per engine_step.',
        labels=('model_name', 'engine'),
        buckets=(1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)),
    PageFamily(
        'vllm:request_max_num_generation_tokens', 'histogram',
        'Histogram of maximum number of requested generation tokens.',
        labels=('model_name', 'engine'),
        buckets=(1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0)),
    PageFamily(
        'vllm:request_params_n', 'histogram',
        'Histogram of the n request parameter.',
        labels=('model_name', 'engine'),
        buckets=(1.0, 2.0, 5.0, 10.0, 20.0)),
    PageFamily(
        'vllm:request_params_max_tokens', 'histogram',
        'Histogram of the max_tokens request parameter.',
        labels=('model_name', 'engine'),
        buckets=(1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0)),
    PageFamily(
        'vllm:time_to_first_token_seconds', 'histogram',
        'Histogram of time to first token in seconds.',
        labels=('model_name', 'engine'),
        buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)),
    PageFamily(
        'vllm:inter_token_latency_seconds', 'histogram',
        'Histogram of inter-token latency in seconds.',
        labels=('model_name', 'engine'),
        buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)),
    PageFamily(
        'vllm:request_time_per_output_token_seconds', 'histogram',
        'Histogram of time_per_output_token_seconds per request.',
        labels=('model_name', 'engine'),
        buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)),
    PageFamily(
        'vllm:e2e_request_latency_seconds', 'histogram',
        'Histogram of e2e request latency in seconds.',
        labels=('model_name', 'engine'),
        buckets=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)),
    PageFamily(
        'vllm:request_queue_time_seconds', 'histogram',
        'Histogram of time spent in WAITING phase for request.',
        labels=('model_name', 'engine'),
        buckets=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)),
    PageFamily(
        'vllm:request_inference_time_seconds', 'histogram',
        'Histogram of time spent in RUNNING phase for request.',
        labels=('model_name', 'engine'),
        buckets=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)),
    PageFamily(
        'vllm:request_prefill_time_seconds', 'histogram',
        'Histogram of time spent in PREFILL phase for request.',
        labels=('model_name', 'engine'),
        buckets=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)),
    PageFamily(
        'vllm:request_decode_time_seconds', 'histogram',
        'Histogram of time spent in DECODE phase for request.',
        labels=('model_name', 'engine'),
        buckets=(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)),
    PageFamily(
        'vllm:request_num_preemptions', 'histogram',
        'Histogram of the number of times a request was preempted.',
        labels=('model_name', 'engine'),
        buckets=(1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)),
    PageFamily(
        'vllm:request_prefill_kv_computed_tokens', 'histogram',
        'Histogram of new KV tokens computed during prefill (excluding cached tokens).',
        labels=('model_name', 'engine'),
        buckets=(1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0, 20000.0)),
    PageFamily(
        'vllm:cache_config_info', 'gauge',
        'Information of the LLMEngine CacheConfig',
        labels=('engine',)),
)

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
               "Number of cached prompt tokens.", labels=("model_name",)),
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
