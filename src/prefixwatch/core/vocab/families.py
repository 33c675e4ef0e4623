"""THE family table: each engine sample prefixwatch re-exposes, the role it plays, what it writes.

One row per family. The page reader files the row's engine sample (on each engine generation
that has it) under the row's role; the monitor keeps counter and histogram roles in its
reset-safe history; the collector and OTLP write the row's ``prefixwatch_*`` family; the mixin's
sources name the row's raw series, the exporter's or the engine's own. Adding an engine counter
is one row here (and its test in tests/exporter/test_families.py).

A row without ``reads`` is a family prefixwatch derives itself (the KV event stream): the page
reader and the monitor pass it by, its own module writes it, and the mixin's sources still name
it. The window ratios, a target's health, the diagnosis and the request log's families are
``OutMetric`` entries of core/vocab/exposition.py without a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from prefixwatch.core.vocab import exposition
from prefixwatch.core.vocab.exposition import OutMetric

# Engine generations (core/vocab/schemas.py), by the id each SourceSchema carries.
VLLM_V1 = "vllm_v1"
VLLM_09 = "vllm_0.9"
VLLM_V0 = "vllm_v0"
SGLANG = "sglang"
_VLLM = (VLLM_V1, VLLM_09, VLLM_V0)


@dataclass(frozen=True)
class Family:
    """Engine sample -> role -> output family."""

    role: str
    out: OutMetric
    #: Engine generation -> the sample read (counters with ``_total``; histograms and gauges by
    #: their family name).
    reads: Mapping[str, str]
    #: A label of ``out`` besides the series' own: ``tier`` (one value per cache tier, filled
    #: from the engine's cached-by-source split, core/vocab/tiers.py) or ``source`` (the engine
    #: sample the value was read from).
    extra: str = ""

    @property
    def kind(self) -> str:
        return self.out.kind

    def read_on(self, schema: str) -> str | None:
        """The engine sample this row reads on one generation (None: it has none)."""
        return self.reads.get(schema)


def _same(sample: str, *schemas: str) -> dict[str, str]:
    return dict.fromkeys(schemas, sample)


FAMILIES: tuple[Family, ...] = (
    Family("queries", exposition.OUT_QUERIES, {
        VLLM_V1: "vllm:prefix_cache_queries_total",
        VLLM_09: "vllm:gpu_prefix_cache_queries_total",
        SGLANG: "sglang:prompt_tokens_total"}),
    Family("hits", exposition.OUT_HITS, {
        VLLM_V1: "vllm:prefix_cache_hits_total",
        VLLM_09: "vllm:gpu_prefix_cache_hits_total",
        SGLANG: "sglang:cached_tokens_total"}),
    Family("ext_queries", exposition.OUT_EXT_QUERIES,
           {VLLM_V1: "vllm:external_prefix_cache_queries_total"}),
    Family("ext_hits", exposition.OUT_EXT_HITS, {VLLM_V1: "vllm:external_prefix_cache_hits_total"}),
    Family("prompt_tokens", exposition.OUT_PROMPT_TOKENS, {
        **_same("vllm:prompt_tokens_total", *_VLLM), SGLANG: "sglang:prompt_tokens_total"}),
    # The engine's all-tier total is what the mixin reads from an engine directly; the page
    # reader splits it by tier from the by-source counters (core/vocab/schemas.py TierSchema).
    Family("prompt_tokens_cached", exposition.OUT_PROMPT_TOKENS_CACHED, {
        VLLM_V1: "vllm:prompt_tokens_cached_total", SGLANG: "sglang:cached_tokens_total"},
        extra=exposition.L_TIER),
    Family("generation_tokens", exposition.OUT_GENERATION_TOKENS, {
        **_same("vllm:generation_tokens_total", *_VLLM), SGLANG: "sglang:generation_tokens_total"}),
    Family("preemptions", exposition.OUT_PREEMPTIONS, _same("vllm:num_preemptions_total", *_VLLM)),
    Family("ttft", exposition.OUT_TTFT, {
        **_same("vllm:time_to_first_token_seconds", *_VLLM),
        SGLANG: "sglang:time_to_first_token_seconds"}),
    Family("prompt_len", exposition.OUT_PROMPT_LEN, _same("vllm:request_prompt_tokens", *_VLLM)),
    Family("finished_requests", exposition.OUT_FINISHED_REQUESTS,
           {SGLANG: "sglang:num_requests_total"}),
    Family("kv_idle_evict", exposition.OUT_KV_IDLE_EVICT,
           {VLLM_V1: "vllm:kv_block_idle_before_evict_seconds"}),
    Family("kv_usage", exposition.OUT_KV_USAGE, {
        VLLM_V1: "vllm:kv_cache_usage_perc", VLLM_09: "vllm:gpu_cache_usage_perc",
        VLLM_V0: "vllm:gpu_cache_usage_perc", SGLANG: "sglang:token_usage"}),
    Family("running", exposition.OUT_RUNNING, {
        **_same("vllm:num_requests_running", *_VLLM), SGLANG: "sglang:num_running_reqs"}),
    Family("waiting", exposition.OUT_WAITING, {
        **_same("vllm:num_requests_waiting", *_VLLM), SGLANG: "sglang:num_queue_reqs"}),
    Family("engine_reported_hit_ratio", exposition.OUT_ENGINE_REPORTED, {
        VLLM_V0: "vllm:gpu_prefix_cache_hit_rate", SGLANG: "sglang:cache_hit_rate"},
        extra=exposition.L_SOURCE),
    # Derived from the engines' KV event streams (exporter/kvsubscriber writes them): no reads.
    Family("kv_events_up", exposition.OUT_KV_EVENTS_UP, {}),
    Family("kv_events", exposition.OUT_KV_EVENTS, {}),
    Family("kv_events_errors", exposition.OUT_KV_EVENTS_ERRORS, {}),
    Family("kv_events_lost", exposition.OUT_KV_EVENTS_LOST, {}),
    Family("kv_blocks", exposition.OUT_KV_BLOCKS, {}),
    Family("kv_resident", exposition.OUT_KV_RESIDENT, {}),
    Family("kv_lifetime", exposition.OUT_KV_LIFETIME, {}),
    Family("kv_computed", exposition.OUT_KV_COMPUTED, {}),
    Family("kv_loaded", exposition.OUT_KV_LOADED, {}),
    Family("kv_divergence", exposition.OUT_KV_DIVERGENCE, {}),
    Family("kv_divergence_kinds", exposition.OUT_KV_DIVERGENCE_KIND, {}),
)

BY_ROLE: dict[str, Family] = {f.role: f for f in FAMILIES}


def read(role: str, schema: str) -> str:
    """The engine sample of one role on one generation (KeyError when it has none)."""
    return BY_ROLE[role].reads[schema]


def roles(kind: str, schema: str | None = None) -> tuple[str, ...]:
    """The roles of one kind (counter, gauge, histogram) read from an engine's page (on
    ``schema`` when given); the tier-split family is left out (its roles are one per tier)."""
    return tuple(f.role for f in FAMILIES if f.kind == kind and f.extra != exposition.L_TIER
                 and f.reads and (schema is None or schema in f.reads))


def exposed(metric: OutMetric) -> str:
    """The series name Prometheus stores for a family: counters ``_total``, histograms
    ``_bucket``, info ``_info``, gauges as named."""
    suffix = {"counter": "_total", "histogram": "_bucket", "info": "_info"}.get(metric.kind, "")
    return metric.name + suffix
