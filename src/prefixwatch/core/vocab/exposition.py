"""Every metric name, label and default that prefixwatch writes: the one table.

The exporter, the rule and dashboard generators and the simulator read these names;
nothing else in the project spells a metric name prefixwatch writes.
"""

from __future__ import annotations

from dataclasses import dataclass

# -- Defaults
#: Port of the exporter's own /metrics. Chosen outside the exporter range that Prometheus'
#: default-port-allocations wiki hands out to other exporters (see docs/configuration.md).
DEFAULT_PORT = 10089
DEFAULT_LISTEN_ADDRESS = f"0.0.0.0:{DEFAULT_PORT}"
DEFAULT_TARGET = "http://localhost:8000/metrics"
DEFAULT_INTERVAL_SECONDS = 5.0
DEFAULT_TIMEOUT_SECONDS = 3.0
DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
# Limits on what one target's page may make the exporter write (docs/configuration.md#limits);
# past a limit the extra series are dropped and counted (reasons too_many_series,
# label_too_long). The defaults fit a vLLM page with 20 models, LoRA adapters and 8 engines.
DEFAULT_MAX_SERIES = 512           # (model, engine) pairs per target
DEFAULT_MAX_MODELS = 64            # distinct model_name values per target
DEFAULT_MAX_LABEL_LENGTH = 512     # characters in one label value
DEFAULT_MAX_BUCKETS = 256          # buckets of one histogram
#: A counter above this is not a count but a broken or hostile page (invalid_value).
MAX_COUNTER_VALUE = 2.0 ** 63
#: /healthz fails when no target was polled (whatever the outcome) within this many intervals.
HEALTHZ_STALE_INTERVALS = 3
#: Windows over which the exporter derives hit ratios and TTFT quantiles.
DEFAULT_WINDOWS: tuple[str, ...] = ("1m", "5m", "15m", "1h")
LIFETIME_WINDOW = "lifetime"
TTFT_QUANTILES: tuple[float, ...] = (0.5, 0.95, 0.99)
#: A model's hit rate below this pages; the dashboards colour against it.
DEFAULT_HIT_RATIO_THRESHOLD = 0.70

# Environment variables the exporter reads when no flag is given.
ENV_TARGETS = "PREFIXWATCH_TARGETS"
ENV_CONFIG = "PREFIXWATCH_CONFIG"

# -- What prefixwatch exposes (no colons: colons are reserved for recording rules)
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
OUT_GENERATION_TOKENS = OutMetric(
    "prefixwatch_generation_tokens", "counter",
    "Generated (output) tokens, counted per engine step as they are sampled.", _SERIES)
OUT_PREEMPTIONS = OutMetric(
    "prefixwatch_preemptions", "counter",
    "Requests preempted because the KV-cache pool was full.", _SERIES)
OUT_TTFT = OutMetric(
    "prefixwatch_time_to_first_token_seconds", "histogram",
    "Time to first token, re-exposed with the engine's own buckets.", _SERIES)
OUT_FINISHED_REQUESTS = OutMetric(
    "prefixwatch_finished_requests", "counter",
    "Requests finished, as the engine counts them (SGLang's num_requests_total; vLLM's count "
    "is its prompt-length histogram's).", _SERIES)
OUT_PROMPT_LEN = OutMetric(
    "prefixwatch_request_prompt_tokens", "histogram",
    "Prompt length per request, re-exposed with the engine's own buckets.", _SERIES)
OUT_KV_IDLE_EVICT = OutMetric(
    "prefixwatch_kv_block_idle_before_evict_seconds", "histogram",
    "Seconds a cached KV block sat unused before it was evicted (vLLM --kv-cache-metrics), "
    "re-exposed with the engine's own buckets.", _SERIES)
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
    "prefixwatch_target_last_success_timestamp_seconds", "gauge",
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
L_POSITION = "position"
L_CULPRIT = "culprit"
OUT_CULPRIT = OutMetric(
    "prefixwatch_prefix_culprit", "gauge",
    "What varies early in the prompts of the diagnosis window, from the KV event stream or "
    "the requests log: its kind, the token where requests most often part, and the sentence "
    "every surface shows; the value is its share of the early divergences.",
    (L_MODEL, L_KIND, L_POSITION, L_CULPRIT))
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


#: What varies where requests diverge (the audit's kinds); "unknown" without a decoder.
DIVERGENCE_KINDS: tuple[str, ...] = ("date/time", "id", "key order", "number", "name", "text",
                                     "unknown")
#: Buckets of the divergence-position histogram, in tokens.
DIVERGENCE_BUCKETS: tuple[float, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                         16384, 32768)
REQUESTS_LOG_RESULTS: tuple[str, ...] = ("request", "truncated", "skipped", "other")

#: Sliding window of the request-level view: at most this many requests and blocks.
REQUESTS_WINDOW_REQUESTS = 4096
REQUESTS_WINDOW_BLOCKS = 262_144


#: Reasons a poll fails; every one is pre-initialised to 0 for every target.
SCRAPE_ERROR_REASONS: tuple[str, ...] = (
    "connect",        # connection refused, DNS, reset
    "timeout",        # no complete answer within the target's timeout
    "tls",            # certificate or handshake failure
    "http_status",    # a status other than 200
    "too_large",      # the body passed the size cap
    "not_metrics",    # HTML error page, or a page without any known engine family
    "parse",          # malformed or truncated exposition, duplicate series
    "invalid_value",  # NaN, infinite, negative or absurdly large (> 2**63) counter
    # Not failures: the page was read, but some of its series were dropped.
    "too_many_series",  # past max_series, max_models or max_buckets of the target
    "label_too_long",   # a label value longer than max_label_length
)


# -- Cache tiers: every tier that saves a prefill counts -----------------------------------

L_TIER = "tier"

#: Cached prompt tokens by the tier that served them (core.tiers.TIERS): ``sum without (tier)``
#: is every token served from a cache.
OUT_PROMPT_TOKENS_CACHED = OutMetric(
    "prefixwatch_prompt_tokens_cached", "counter",
    "Prompt tokens served from a cache instead of recomputed, by the tier that served them "
    "(device, host, disk, remote, unknown).", (*_SERIES, L_TIER))
OUT_EFFECTIVE_HIT_RATIO = OutMetric(
    "prefixwatch_effective_hit_ratio", "gauge",
    "Share of prompt tokens served from any cache tier over a window: "
    "delta(cached, all tiers)/delta(prompt tokens), reset-safe; absent without prompt tokens.",
    (L_TARGET, L_MODEL, L_SERVER, L_WINDOW))
OUT_FLEET_EFFECTIVE_HIT_RATIO = OutMetric(
    "prefixwatch_fleet_effective_hit_ratio", "gauge",
    "Share of a model's prompt tokens served from any cache tier over all targets: sum of "
    "cached over sum of prompt tokens; absent without prompt tokens.",
    (L_MODEL, L_WINDOW))


# -- The hit-rate ledger: where every prompt token of the log went --------------------------

L_PART = "part"
OUT_LEDGER_TOKENS = OutMetric(
    "prefixwatch_ledger_tokens", "counter",
    "Prompt tokens of the requests log by ledger part: prompt, novel (no earlier request "
    "shares it), layout (a prompt-layout fix would share it), routing (cached on another "
    "replica), eviction (the replica's pool lost it), pool_reach (what the pool would "
    "serve); prompt = novel + layout + routing + eviction + pool_reach. A part that cannot be "
    "measured (routing without a replica per request, eviction without the pool size) is "
    "absent.", (L_MODEL, L_PART))
OUT_LEDGER_RATIO = OutMetric(
    "prefixwatch_ledger_ratio", "gauge",
    "Share of the window's logged prompt tokens by ledger part (achieved, novel, layout, "
    "routing, eviction, unexplained = pool_reach - achieved); the parts sum to 1. Achieved is "
    "the engine's cached tokens over the window.", (L_MODEL, L_WINDOW, L_PART))
#: Ledger counter parts, and the shares that sum to 1 (core/cache/requestledger.py).
LEDGER_COUNTED: tuple[str, ...] = ("prompt", "novel", "layout", "routing", "eviction",
                                   "pool_reach")
LEDGER_SHARES: tuple[str, ...] = ("achieved", "novel", "layout", "routing", "eviction",
                                  "unexplained")


# -- KV cache events: what each engine cached, evicted and recomputed, from its own stream ----

L_TYPE = "type"
L_MEDIUM = "medium"
L_OP = "op"

OUT_KV_EVENTS_UP = OutMetric(
    "prefixwatch_kv_events_up", "gauge",
    "1 while the target's KV event stream is subscribed and decoding, 0 otherwise.",
    (L_TARGET,))
OUT_KV_EVENTS = OutMetric(
    "prefixwatch_kv_events", "counter",
    "KV cache events received from the target, by type (BlockStored, BlockRemoved, "
    "AllBlocksCleared).", (L_TARGET, L_TYPE))
OUT_KV_EVENTS_ERRORS = OutMetric(
    "prefixwatch_kv_events_errors", "counter",
    "KV event messages, events or blocks not used, by reason (docs/kv-events.md).",
    (L_TARGET, L_REASON))
OUT_KV_EVENTS_LOST = OutMetric(
    "prefixwatch_kv_events_lost", "counter",
    "KV event messages missing by sequence number and not replayed.", (L_TARGET,))
OUT_KV_BLOCKS = OutMetric(
    "prefixwatch_kv_blocks", "counter",
    "KV cache blocks the target stored or removed, by medium as the engine names it (GPU, "
    "CPU) and op (stored, removed); copies count one each.", (L_TARGET, L_MEDIUM, L_OP))
OUT_KV_RESIDENT = OutMetric(
    "prefixwatch_kv_resident_blocks", "gauge",
    "KV cache blocks the target holds now, by medium, counting copies (stored - removed).",
    (L_TARGET, L_MEDIUM))
OUT_KV_LIFETIME = OutMetric(
    "prefixwatch_kv_block_lifetime_seconds", "histogram",
    "Seconds from a block's store to its removal, observed at removal for every block (engine "
    "timestamps).", (L_TARGET, L_MEDIUM))
OUT_KV_COMPUTED = OutMetric(
    "prefixwatch_kv_computed_tokens", "counter",
    "Tokens of the device blocks the target computed (stored, no lower tier supplied them), by "
    "why: eviction (this replica held the content before and removed it), routing (another "
    "replica holds it), layout (the same text as an earlier chain after a short divergence), "
    "novel (the rest, answers' blocks included); and tail, the tokens of each request's last "
    "partial block (never cached), from the engine's counters beside the stream.",
    (L_TARGET, L_MODEL, L_PART))
OUT_KV_LOADED = OutMetric(
    "prefixwatch_kv_loaded_tokens", "counter",
    "Tokens of the device blocks a lower tier of the target supplied, by that tier's medium.",
    (L_TARGET, L_MODEL, L_MEDIUM))
OUT_KV_DIVERGENCE = OutMetric(
    "prefixwatch_kv_divergence_position_tokens", "histogram",
    "Token position where a new chain of cached blocks leaves the closest known chain (a "
    "timestamp at token 8 reads 8), from the KV event stream.", (L_TARGET, L_MODEL))
OUT_KV_DIVERGENCE_KIND = OutMetric(
    "prefixwatch_kv_divergences", "counter",
    "New chains of cached blocks by what varies where they leave the closest known chain "
    "(the target's /detokenize names it; unknown without one).", (L_TARGET, L_MODEL, L_KIND))

L_POOL_SCALE = "pool_scale"
OUT_KV_POOL_BLOCKS = OutMetric(
    "prefixwatch_kv_pool_blocks", "gauge",
    "The target's device KV pool in blocks (num_gpu_blocks of vllm:cache_config_info, or the "
    "target's kv_pool_blocks in the config): the unit of pool_scale.", (L_TARGET,))
OUT_KV_WHATIF = OutMetric(
    "prefixwatch_kv_whatif_cached_tokens", "counter",
    "Prompt tokens the target would have had cached with pool_scale times its device KV pool: "
    "the engine's cached tokens (every tier) plus the blocks it computed again after evicting "
    "them, within that pool's reach (measured from its KV event stream, first order: a lower "
    "bound). Beside prefixwatch_prompt_tokens_total, a rate() quotient is the what-if hit "
    "ratio.", (L_TARGET, L_MODEL, L_POOL_SCALE))
#: The pool_scale values of the what-if counter (multiples of the device pool).
KV_WHATIF_POOL_SCALES: tuple[str, ...] = ("1.25", "1.5", "2", "4")

#: Why a device block had to be computed, in the order the ledger prints them.
KV_COMPUTED_PARTS: tuple[str, ...] = ("eviction", "routing", "layout", "novel")
#: The ``op`` label of the block counter: blocks stored, and blocks removed (evicted).
KV_BLOCK_OPS: tuple[str, ...] = ("stored", "removed")
#: The ledger part of the prompt tokens no full block covers (a tail shorter than a block),
#: which the event stream never shows: the event ledger's own named part.
LEDGER_TAIL = "tail"
#: The event ledger's generated tokens whose KV the engine computed (one fewer per finished
#: request than it sampled): cached in the answers' blocks, named beside the prompt's parts.
LEDGER_OUTPUT = "output"
#: The parts of prefixwatch_kv_computed_tokens_total: the stream's four, and the tail.
KV_COMPUTED_SERIES_PARTS: tuple[str, ...] = (*KV_COMPUTED_PARTS, LEDGER_TAIL)
#: Shares of the event ledger (they sum to 1): the request ledger's, with the tail.
KV_LEDGER_SHARES: tuple[str, ...] = ("achieved", *KV_COMPUTED_PARTS, LEDGER_TAIL, "unexplained")
#: Buckets of the block-lifetime histogram, in seconds.
KV_LIFETIME_BUCKETS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200,
                                          21600, 86400)
#: Limits of one exporter's mirrors: content blocks remembered per model (the oldest no replica
#: holds are forgotten first) and resident copies per target; past them, counted reasons.
#: A mirrored block costs about 1.2 KB (benchmarks/bench_kv_events.py's frames).
KV_MAX_CONTENT_BLOCKS = 262_144
KV_MAX_RESIDENT_BLOCKS = 1_048_576
#: Ghosts (content a replica evicted, with its removal clock) kept per target for the pool
#: what-if (core/kv/whatif.py); they also go once past the largest scale's reach.
KV_MAX_GHOST_BLOCKS = 262_144
#: A message larger than this is dropped (too_large).
KV_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
#: Messages queued per subscription socket before ZMQ drops (its receive high-water mark).
KV_RECEIVE_HWM = 10_000
#: One replay exchange (request to the end marker) must finish within this many seconds.
KV_REPLAY_TIMEOUT_SECONDS = 2.0
#: Reconnect backoff of a subscription, first and longest wait.
KV_RECONNECT_SECONDS = (0.1, 5.0)

KV_ERROR_HISTORY_FULL = "history_full"
KV_ERROR_MIRROR_FULL = "mirror_full"
KV_ERROR_TOKENS = "token_count"
KV_ERROR_UNKNOWN_PARENT = "unknown_parent"
KV_ERROR_UNKNOWN_BLOCK = "unknown_block"
KV_ERROR_GHOSTS_FULL = "whatif_full"
#: Reasons of prefixwatch_kv_events_errors_total; each is pre-initialised to 0 per target.
KV_ERROR_REASONS: tuple[str, ...] = (
    "malformed_payload",   # not a msgpack KVEventBatch
    "unknown_event_type",  # an event whose tag this version does not know (the rest is used)
    "wrong_frame_count",   # a message of other than three frames (topic, sequence, payload)
    "bad_sequence",        # a sequence frame that is not 8 bytes
    "too_large",           # a message over the size limit
    "unknown_topic",       # (listen mode) a topic no target is mapped to
    "sequence_restart",    # the sequence went back: a restarted publisher, mirror cleared
    "replay_timeout",      # the replay endpoint did not finish within its deadline
    "replay_error",        # the replay endpoint answered something unusable
    "disconnected",        # the publisher's connection dropped (or its heartbeat stopped)
    KV_ERROR_TOKENS,       # token_ids not block_size per stored block: chain content unknown
    KV_ERROR_UNKNOWN_PARENT,  # a parent hash never seen: the chain starts at a placeholder
    KV_ERROR_UNKNOWN_BLOCK,   # a removal of a block never seen stored
    KV_ERROR_MIRROR_FULL,     # resident copies past the target's cap: not mirrored
    KV_ERROR_HISTORY_FULL,    # old content forgotten by the model's cap
    KV_ERROR_GHOSTS_FULL,     # evicted content within the what-if's reach forgotten at its cap
)


# -- Routers: what a router believed, per router and per worker it routes to -----------------

L_ROUTER = "router"
L_WORKER = "worker"
L_POLICY = "policy"
L_PROBLEM = "problem"
L_RUNG = "rung"

OUT_ROUTER_INFO = OutMetric(
    "prefixwatch_router", "info",
    "The kind of router detected on a router target (vllm_router, smg, llm_d, dynamo, "
    "production_stack).", (L_ROUTER,), info_keys=(L_KIND,))
OUT_ROUTER_WORKER_REQUESTS = OutMetric(
    "prefixwatch_router_worker_requests", "counter",
    "Requests the router sent to one worker, as the router counts them.", (L_ROUTER, L_WORKER))
OUT_ROUTER_WORKER_TARGET = OutMetric(
    "prefixwatch_router_worker_target", "gauge",
    "1 for each worker of a router matched to the engine target that serves it (by URL, or "
    "the router's workers: map); the join between a router's series and its engines'.",
    (L_ROUTER, L_WORKER, L_TARGET))
OUT_ROUTER_UNMATCHED_WORKERS = OutMetric(
    "prefixwatch_router_unmatched_workers", "gauge",
    "Workers of the router matched to no engine target, by reason (no_target: no target "
    "serves that URL; shared: another router, earlier in the config, claims that target).",
    (L_ROUTER, L_REASON))
OUT_ROUTER_DECISIONS = OutMetric(
    "prefixwatch_router_decisions", "counter",
    "Routing decisions by policy, as the router counts them.", (L_ROUTER, L_POLICY))
OUT_ROUTER_PREDICTED_HITS = OutMetric(
    "prefixwatch_router_predicted_hits", "counter",
    "What the router believed: its lookups that hit its index (or, for a match-ratio "
    "histogram, the predicted matched share summed over requests), by the router sample read.",
    (L_ROUTER, L_SOURCE))
OUT_ROUTER_PREDICTIONS = OutMetric(
    "prefixwatch_router_predictions", "counter",
    "The router's lookups (or requests scored) behind prefixwatch_router_predicted_hits; "
    "the believed hit share is the ratio of their rates.", (L_ROUTER, L_SOURCE))
OUT_ROUTER_KV_FEED_PROBLEMS = OutMetric(
    "prefixwatch_router_kv_feed_problems", "counter",
    "Problems of the router's own KV event feed, per worker, as the router counts them "
    "(gap, resync, missed_batches, subscription_failure, stream_error).",
    (L_ROUTER, L_WORKER, L_PROBLEM))
OUT_ROUTER_ERRORS = OutMetric(
    "prefixwatch_router_errors", "counter",
    "Parts of a router's page not used, by reason (see ROUTER_ERROR_REASONS).",
    (L_ROUTER, L_REASON))
#: Reasons of prefixwatch_router_errors_total; each is pre-initialised to 0 per router.
ROUTER_ERROR_REASONS: tuple[str, ...] = (
    "unknown_value",     # a label value this release does not know (a newer router): not used
    "changed_type",      # a family read with another type than expected: not used
    "no_known_family",   # the router's page carries none of the families prefixwatch reads
    "too_many_series",   # workers past max_series: the rest dropped
    "label_too_long",    # a label value past max_label_length: that sample dropped
)
ROUTER_UNMATCHED_NO_TARGET = "no_target"
ROUTER_UNMATCHED_SHARED = "shared"
ROUTER_UNMATCHED_REASONS: tuple[str, ...] = (ROUTER_UNMATCHED_NO_TARGET, ROUTER_UNMATCHED_SHARED)
#: Target kinds in the exporter's config (``kind:``; "" recognises a router from its page).
TARGET_KIND_ENGINE = "engine"
TARGET_KIND_ROUTER = "router"
TARGET_KINDS: tuple[str, ...] = ("", TARGET_KIND_ENGINE, TARGET_KIND_ROUTER)

OUT_LADDER = OutMetric(
    "prefixwatch_ladder_hit_ratio", "gauge",
    "A model's hit ratio over the window as delivered, then with each fix the KV event ledger "
    "names added (rung: delivered, perfect_routing, capacity, ideal_prompts; core/kv/ladder.py). "
    "The step between two rungs is what that fix is worth. Capacity is absent until the "
    "capacity what-if measures it.", (L_MODEL, L_WINDOW, L_RUNG))
#: Each reason in words, where its count is shown (the landing page): what happened and
#: whether it matters.
KV_ERROR_MEANINGS: dict[str, str] = {
    "malformed_payload": "messages that are not a KV event batch (dropped)",
    "unknown_event_type": "events of a type this version does not know (skipped, the rest "
                          "used)",
    "wrong_frame_count": "messages of other than three frames (dropped)",
    "bad_sequence": "messages whose sequence number is not 8 bytes (dropped)",
    "too_large": "messages over the size limit (dropped)",
    "unknown_topic": "messages on a topic no target is mapped to (listen mode)",
    "sequence_restart": "times the engine's sequence went back (a restart): its blocks "
                        "forgotten",
    "replay_timeout": "replays of missed messages that did not finish in time",
    "replay_error": "replays that answered something unusable",
    "disconnected": "times the stream dropped (reconnected on its own)",
    KV_ERROR_TOKENS: "stored blocks without their tokens: their content is unknown",
    KV_ERROR_UNKNOWN_PARENT: "chains whose first parent was stored before the exporter "
                             "listened: their start is unknown, the rest is counted",
    KV_ERROR_UNKNOWN_BLOCK: "removals of blocks stored before the exporter listened: "
                            "harmless, expected for a while after it starts",
    KV_ERROR_MIRROR_FULL: "resident copies past the target's cap: not mirrored",
    KV_ERROR_HISTORY_FULL: "old content forgotten at the model's cap",
    KV_ERROR_GHOSTS_FULL: "evicted content within the pool what-if's reach forgotten at its "
                          "cap: the larger pools' gains are a little low",
}
