"""THE source table: which raw series the rules, dashboards and promtool tests read, by role.

A source is where Prometheus gets the prefix-cache counters: the exporter's ``prefixwatch_*``
series, or an engine's own series scraped directly: both columns of the family table
(``core/vocab/families.py``).
Rules, dashboards and the generated promtool tests all look names up here; nothing else in the
mixin spells a raw series name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab import exposition, families, schemas, tiers

SOURCES = ("exporter", "vllm", "sglang")
#: Labels of the exporter's own series (its job and address), in the promtool tests.
EXPORTER_JOB = {"job": "prefixwatch", "instance": f"prefixwatch:{exposition.DEFAULT_PORT}"}


@dataclass(frozen=True)
class TierSeries:
    """Where one source counts cached prompt tokens by tier, and what shows a second tier at
    work. Facts and label values come from core/vocab/tiers.py (checked in docs/tiers.md)."""

    #: Counter of cached prompt tokens, split by ``label`` (the engine's source, or our tier).
    cached: str
    label: str
    #: The effective ratio's denominator: prompt tokens that looked up the cache.
    total: str
    #: (regex of ``label`` values, tier), applied in order after "unknown": the last match
    #: wins. Empty: ``label`` already holds our tier.
    mapping: tuple[tuple[str, str], ...] = ()
    #: (counter, tier) standing in when ``cached`` is absent (vLLM before by-source counters).
    fallback: tuple[tuple[str, str], ...] = ()
    #: The ``label`` value the engine writes for each of our tiers (the promtool tests').
    written: tuple[tuple[str, str], ...] = ((tiers.TIER_DEVICE, tiers.TIER_DEVICE),
                                            (tiers.TIER_HOST, tiers.TIER_HOST))
    #: Counters (with matchers) whose rate > 0, and gauges > 0, show a second tier taking data.
    active_counters: tuple[tuple[str, str], ...] = ()
    active_gauges: tuple[str, ...] = ()
    #: The offload connector's store outcomes: the counter, its label, the lost outcomes and
    #: the successful one (None: the engine does not count lost stores).
    offload_outcomes: str | None = None
    offload_label: str = ""
    offload_failed: tuple[str, ...] = ()
    offload_stored: str = ""

    def written_value(self, tier: str) -> str:
        return dict(self.written)[tier]


def _vllm_mapping() -> tuple[tuple[str, str], ...]:
    by_tier: dict[str, list[str]] = {}
    for value in tiers.VLLM_CACHED_SOURCES:
        by_tier.setdefault(tiers.vllm_source_tier(value), []).append(value)
    return tuple(("|".join(v), tier) for tier, v in by_tier.items()
                 if tier != tiers.TIER_UNKNOWN)


def _sglang_mapping() -> tuple[tuple[str, str], ...]:
    storage = tiers.SGLANG_STORAGE_PREFIX
    return ((f"{storage}.+", tiers.TIER_REMOTE),
            ("|".join(storage + b for b in sorted(tiers.SGLANG_LOCAL_DISK_BACKENDS)),
             tiers.TIER_DISK),
            (f"{storage}unknown", tiers.TIER_UNKNOWN),
            (tiers.SGLANG_SOURCE_DEVICE, tiers.TIER_DEVICE),
            (tiers.SGLANG_SOURCE_HOST, tiers.TIER_HOST))


@dataclass(frozen=True)
class Source:
    """Raw series names of one source, by the family table's roles (core/vocab/families.py):
    ``src.queries``, ``src.ttft`` (a histogram's ``_bucket`` series)... None where the source
    has no such series."""

    name: str
    replica_label: str  # the label naming a replica on the raw series
    liveness: str  # a series whose absence means "no data at all"
    #: Role -> raw series name, from the family table.
    raw: Mapping[str, str]
    target_up: str | None = None  # the exporter's per-target up
    scrape_errors: str | None = None  # the exporter's failed polls, by reason
    #: The engine whose caching unit the texts name ("block" for vLLM, "page" for SGLang).
    engine: str = "vllm"
    #: Labels a raw series of one replica carries besides job, replica and model.
    sample_extra: dict[str, str] = field(default_factory=dict)
    #: Matchers that keep the device tier of ``hits`` (SGLang counts every tier in one family).
    hits_matchers: str = ""
    tiers: TierSeries | None = None

    def __getattr__(self, role: str) -> str | None:
        if role not in families.BY_ROLE:
            raise AttributeError(role)
        return self.raw.get(role)

    @property
    def title(self) -> str:
        return {"exporter": "", "vllm": "vLLM series", "sglang": "SGLang series"}[self.name]

    def sample_labels(self, target: str, model: str) -> dict[str, str]:
        """The labels of one replica's raw series as Prometheus stores them (the tests')."""
        if self.name == "exporter":
            return {**EXPORTER_JOB, exposition.L_TARGET: target, exposition.L_MODEL: model,
                    **self.sample_extra}
        return {"job": self.name, "instance": target, exposition.L_MODEL: model,
                **self.sample_extra}


def _exporter() -> Source:
    counter = families.exposed
    return Source(
        "exporter", replica_label=exposition.L_TARGET, liveness=counter(exposition.OUT_BUILD_INFO),
        raw={f.role: counter(f.out) for f in families.FAMILIES},
        target_up=exposition.OUT_TARGET_UP.name,
        scrape_errors=counter(exposition.OUT_SCRAPE_ERRORS),
        sample_extra={exposition.L_ENGINE: "0", exposition.L_SERVER: "vllm"},
        tiers=TierSeries(
            cached=counter(exposition.OUT_PROMPT_TOKENS_CACHED), label=exposition.L_TIER,
            total=counter(exposition.OUT_PROMPT_TOKENS),
            fallback=((counter(exposition.OUT_HITS), tiers.TIER_DEVICE),
                      (counter(exposition.OUT_EXT_HITS), tiers.TIER_UNKNOWN)),
            active_counters=((counter(exposition.OUT_EXT_QUERIES), ""),)))


def _vllm_tiers() -> TierSeries:
    failed = "|".join(tiers.VLLM_OFFLOAD_OUTCOMES_FAILED)

    def v1(role: str) -> str:
        return families.read(role, families.VLLM_V1)

    return TierSeries(
        cached=tiers.VLLM_CACHED_BY_SOURCE, label=tiers.VLLM_SOURCE_LABEL,
        total=v1("queries"), mapping=_vllm_mapping(),
        fallback=((v1("hits"), tiers.TIER_DEVICE), (v1("ext_hits"), tiers.TIER_UNKNOWN)),
        active_counters=((v1("ext_queries"), ""),
                         (tiers.VLLM_OFFLOAD_SAVE_OUTCOMES,
                          f'{tiers.VLLM_OFFLOAD_OUTCOME_LABEL}='
                          f'"{tiers.VLLM_OFFLOAD_OUTCOME_STORED}"')),
        active_gauges=(tiers.VLLM_OFFLOAD_USED_BLOCKS,),
        offload_outcomes=tiers.VLLM_OFFLOAD_SAVE_OUTCOMES,
        offload_label=tiers.VLLM_OFFLOAD_OUTCOME_LABEL, offload_failed=(failed,),
        offload_stored=tiers.VLLM_OFFLOAD_OUTCOME_STORED)


def _sglang_tiers() -> TierSeries:
    return TierSeries(
        cached=tiers.SGLANG_CACHED_BY_SOURCE, label=tiers.SGLANG_SOURCE_LABEL,
        total=families.read("prompt_tokens", families.SGLANG), mapping=_sglang_mapping(),
        written=((tiers.TIER_DEVICE, tiers.SGLANG_SOURCE_DEVICE),
                 (tiers.TIER_HOST, tiers.SGLANG_SOURCE_HOST)),
        active_counters=((tiers.SGLANG_HICACHE_BACKUP_TOKENS, ""),),
        active_gauges=(tiers.SGLANG_HICACHE_HOST_USED,))


def _engine(name: str, schema: schemas.SourceSchema, extra: dict[str, str],
            tier_series: TierSeries, hits_matchers: str = "") -> Source:
    raw = {f.role: read + ("_bucket" if f.kind == "histogram" else "")
           for f in families.FAMILIES if (read := f.read_on(schema.schema))}
    return Source(name, replica_label="instance", liveness=raw["queries"], raw=raw,
                  engine=schema.server, sample_extra=extra, hits_matchers=hits_matchers,
                  tiers=tier_series)


_TABLE: dict[str, Source] = {
    "exporter": _exporter(),
    "vllm": _engine("vllm", schemas.VLLM_V1, {schemas.VLLM_V1.engine_labels[0]: "0"},
                    _vllm_tiers()),
    # sglang:cached_tokens_total counts every tier: the device ratio keeps all but host and
    # storage (``total`` and a missing label are builds without per-source detail).
    "sglang": _engine("sglang", schemas.SGLANG, {}, _sglang_tiers(),
                      hits_matchers=f'{tiers.SGLANG_SOURCE_LABEL}!~"{tiers.SGLANG_SOURCE_HOST}|'
                                    f'{tiers.SGLANG_STORAGE_PREFIX}.+"'),
}


def source(name: str) -> Source:
    """The row of one source; ConfigError for an unknown name."""
    try:
        return _TABLE[name]
    except KeyError:
        raise ConfigError(f"unknown source {name!r}; one of {', '.join(SOURCES)}") from None
