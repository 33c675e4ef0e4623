"""THE source table: which raw series the rules, dashboards and promtool tests read, by role.

A source is where Prometheus gets the prefix-cache counters: the exporter's ``prefixwatch_*``
series (``core/names.py``), or an engine's own series scraped directly (``core/schemas.py``).
Rules, dashboards and the generated promtool tests all look names up here; nothing else in the
mixin spells a raw series name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixwatch.core import names, schemas
from prefixwatch.core.errors import ConfigError

SOURCES = ("exporter", "vllm", "sglang")
#: Labels of the exporter's own series (its job and address), in the promtool tests.
EXPORTER_JOB = {"job": "prefixwatch", "instance": f"prefixwatch:{names.DEFAULT_PORT}"}


@dataclass(frozen=True)
class Source:
    """Raw series names of one source, by role (None: the source has no such series)."""

    name: str
    queries: str
    hits: str
    replica_label: str  # the label naming a replica on the raw series
    liveness: str  # a series whose absence means "no data at all"
    ext_queries: str | None = None
    ext_hits: str | None = None
    prompt_tokens: str | None = None
    prompt_tokens_cached: str | None = None
    ttft_bucket: str | None = None
    prompt_len_bucket: str | None = None
    kv_usage: str | None = None
    preemptions: str | None = None
    running: str | None = None
    waiting: str | None = None
    target_up: str | None = None  # the exporter's per-target up
    scrape_errors: str | None = None  # the exporter's failed polls, by reason
    #: The engine whose caching unit the texts name ("block" for vLLM, "page" for SGLang).
    engine: str = "vllm"
    #: Labels a raw series of one replica carries besides job, replica and model.
    sample_extra: dict[str, str] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return {"exporter": "", "vllm": "vLLM series", "sglang": "SGLang series"}[self.name]

    def sample_labels(self, target: str, model: str) -> dict[str, str]:
        """The labels of one replica's raw series as Prometheus stores them (the tests')."""
        if self.name == "exporter":
            return {**EXPORTER_JOB, names.L_TARGET: target, names.L_MODEL: model,
                    **self.sample_extra}
        return {"job": self.name, "instance": target, names.L_MODEL: model, **self.sample_extra}


def _bucket(histogram: str | None) -> str | None:
    return histogram + "_bucket" if histogram else None


def _exporter() -> Source:
    def counter(metric: names.OutMetric) -> str:
        return metric.name + "_total"

    return Source(
        "exporter", queries=counter(names.OUT_QUERIES), hits=counter(names.OUT_HITS),
        replica_label=names.L_TARGET, liveness=names.OUT_BUILD_INFO.name + "_info",
        ext_queries=counter(names.OUT_EXT_QUERIES), ext_hits=counter(names.OUT_EXT_HITS),
        prompt_tokens=counter(names.OUT_PROMPT_TOKENS),
        prompt_tokens_cached=counter(names.OUT_PROMPT_TOKENS_CACHED),
        ttft_bucket=_bucket(names.OUT_TTFT.name),
        prompt_len_bucket=_bucket(names.OUT_PROMPT_LEN.name),
        kv_usage=names.OUT_KV_USAGE.name, preemptions=counter(names.OUT_PREEMPTIONS),
        running=names.OUT_RUNNING.name, waiting=names.OUT_WAITING.name,
        target_up=names.OUT_TARGET_UP.name, scrape_errors=counter(names.OUT_SCRAPE_ERRORS),
        sample_extra={names.L_ENGINE: "0", names.L_SERVER: "vllm"})


def _engine(name: str, schema: schemas.SourceSchema, extra: dict[str, str]) -> Source:
    assert schema.queries and schema.hits, f"{schema.schema} has no prefix-cache counters"
    return Source(
        name, queries=schema.queries, hits=schema.hits, replica_label="instance",
        liveness=schema.queries, ext_queries=schema.ext_queries, ext_hits=schema.ext_hits,
        prompt_tokens=schema.prompt_tokens, prompt_tokens_cached=schema.prompt_tokens_cached,
        ttft_bucket=_bucket(schema.ttft), prompt_len_bucket=_bucket(schema.prompt_len),
        kv_usage=schema.kv_usage, preemptions=schema.preemptions, running=schema.running,
        waiting=schema.waiting, engine=schema.server, sample_extra=extra)


_TABLE: dict[str, Source] = {
    "exporter": _exporter(),
    "vllm": _engine("vllm", schemas.VLLM_V1, {schemas.VLLM_V1.engine_labels[0]: "0"}),
    "sglang": _engine("sglang", schemas.SGLANG, {}),
}


def source(name: str) -> Source:
    """The row of one source; ConfigError for an unknown name."""
    try:
        return _TABLE[name]
    except KeyError:
        raise ConfigError(f"unknown source {name!r}; one of {', '.join(SOURCES)}") from None
