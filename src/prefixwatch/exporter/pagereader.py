"""Read an engine's /metrics page into the few numbers prefixwatch needs.

A vLLM page holds about 90 families; prefixwatch reads about a dozen (core/vocab/families.py).
Parsing the whole page with client_python costs ~9 ms, so the page is first cut down to the
lines of the wanted samples (a string scan). Each kept line is split here into name, label
block and value; label blocks go through client_python's parser, memoised per block, so
label escaping is never re-implemented.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefixwatch.core.vocab import exposition, schemas, tiers
from prefixwatch.core.vocab.schemas import SourceSchema, TierSchema
from prefixwatch.exporter.pagescan import (
    SHARED_LABELS,
    Admission,
    LabelCache,
    PageError,
    PageLimits,
    SeriesKey,
    check_counter,
    detect_schema,
    histogram_of,
    parse_value,
    quick_model,
    select_samples,
)

#: Counter role of the cached prompt tokens one tier served ("cached_device", ...).
TIER_ROLES: dict[str, str] = {tier: f"cached_{tier}" for tier in tiers.TIERS}
#: Counter role of the cached prompt tokens of every tier (what the effective ratio counts).
CACHED = "cached"
#: Counter role of the blocks/tokens stored into the second tier (vLLM stored saves, SGLang
#: host backups); gauge role of what the second tier holds; cached-token role of SGLang's
#: sources that the engine counts as its own (device) hits.
TIER_STORES = "tier_stores"
TIER_USED = "tier_used"
TIER_CONFIGURED = "tier_configured"


@dataclass(frozen=True)
class Histogram:
    """A cumulative histogram as the page shows it; bounds end with +Inf."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float
    count: float


@dataclass
class SeriesValues:
    """What one (model, engine) series of a target reports, by role (see SourceSchema)."""

    counters: dict[str, float] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)
    cache_info: dict[str, str] = field(default_factory=dict)

    @property
    def block_size(self) -> int | None:
        try:
            return int(self.cache_info[schemas.CACHE_INFO_BLOCK_SIZE])
        except (KeyError, ValueError):
            return None

    @property
    def caching_enabled(self) -> bool | None:
        value = self.cache_info.get(schemas.CACHE_INFO_ENABLED)
        return None if value is None else value.strip().lower() in ("true", "1")


@dataclass
class Snapshot:
    """One successful read of a target's page."""

    schema: SourceSchema
    series: dict[SeriesKey, SeriesValues]
    #: Series (or label sets) left out by a limit, by reason (too_many_series, label_too_long).
    dropped: dict[str, int] = field(default_factory=dict)


def _family_names(sample_names: frozenset[str]) -> frozenset[str]:
    """The sample names and the histogram families they belong to."""
    return sample_names | {n.removesuffix(s) for n in sample_names
                           for s in ("_bucket", "_sum", "_count") if n.endswith(s)}


def _tier_schema(schema: SourceSchema) -> TierSchema | None:
    """The tier families of a schema that can have them (windows need counters)."""
    if not schema.windows_supported or schema.read("queries") is None:
        return None
    return schemas.TIER_SCHEMAS.get(schema.server)


_WANTED: dict[str, frozenset[str]] = {
    s.schema: _family_names(s.sample_names() | (
        t.sample_names() if (t := _tier_schema(s)) is not None else frozenset()))
    for s in schemas.SCHEMAS
}


def read_page(text: str, labels: LabelCache | None = None,
              limits: PageLimits | None = None) -> Snapshot:
    """Parse a /metrics body into a Snapshot, or raise PageError with a reason.

    ``labels`` lets each target keep its own memo of label blocks; ``limits`` bound what the
    page can make the exporter hold and write (extra series are dropped and counted).
    """
    if not text.strip():
        raise PageError("not_metrics", "empty page")
    head = text.lstrip()[:200].lower()
    if head.startswith(("<!doctype", "<html", "<?xml", "{")):
        raise PageError("not_metrics", "an HTML, XML or JSON document, not a metrics page")
    if not text.endswith("\n"):
        raise PageError("parse", "page does not end with a newline (truncated?)")
    schema = detect_schema(text)
    if schema is None:
        raise PageError("not_metrics", "no vLLM or SGLang prefix-cache metrics on the page")
    cache = labels if labels is not None else SHARED_LABELS
    admission = Admission(limits or PageLimits())
    max_block, max_len = admission.limits.max_block, admission.limits.max_label_length
    samples = []
    # Buckets counted per histogram (name + labels without le) before any parsing, so a
    # 60,000-bucket histogram costs a string cut per line, not a parse.
    bucket_counts: dict[tuple[str, str], int] = {}
    over: set[tuple[str, str]] = set()
    tags: list[tuple[str, str] | None] = []
    for name, block, rest in select_samples(text, _WANTED[schema.schema]):
        if len(block) > max_block:
            admission.drop("label_too_long")
            continue
        model = quick_model(block)
        if model is not None and admission.model_full(model):
            admission.drop("too_many_series")  # not even parsed: 10,000 models cost little
            continue
        tag = histogram_of(name, block)
        if tag is not None:
            count = bucket_counts[tag] = bucket_counts.get(tag, 0) + 1
            if count > admission.limits.max_buckets:
                over.add(tag)
                continue
        parsed = cache.parse(block)
        if any(len(v) > max_len for v in parsed.values()):
            admission.drop("label_too_long")
            continue
        samples.append((name, parsed, parse_value(name, rest)))
        tags.append(tag)
    if over:  # drop the whole histogram: a part of its buckets would lie
        samples = [s for s, tag in zip(samples, tags, strict=True) if tag not in over]
        for _ in over:
            admission.drop("too_many_series")
    snapshot = _normalize(schema, samples, admission)
    snapshot.dropped = admission.dropped
    return snapshot


def _series_key(schema: SourceSchema, labels: dict[str, str]) -> SeriesKey | None:
    for rank in schema.rank_labels:
        if labels.get(rank, "0") != "0":
            return None  # the same counter, repeated by another rank
    engine = next((labels[n] for n in schema.engine_labels if n in labels), "0")
    return labels.get(exposition.L_MODEL, ""), engine


def _role_tables(schema: SourceSchema) -> tuple[dict[str, list[tuple[str, str]]], dict[str, str]]:
    """Sample name -> roles it plays, and histogram sample name -> role, for one schema."""
    # One sample may play several roles (SGLang's prompt tokens are also its cache queries).
    roles_by_sample: dict[str, list[tuple[str, str]]] = {}
    for role, name in schema.roles("counter").items():
        roles_by_sample.setdefault(name, []).append(("counter", role))
        created = name.removesuffix("_total") + "_created"
        roles_by_sample.setdefault(created, []).append(("created", role))
    for role, name in schema.roles("gauge").items():
        roles_by_sample.setdefault(name, []).append(("gauge", role))
    hist_roles: dict[str, str] = {}
    for role, name in schema.roles("histogram").items():
        for suffix in ("_bucket", "_sum", "_count"):
            hist_roles[name + suffix] = role
    return roles_by_sample, hist_roles


_ROLES = {s.schema: _role_tables(s) for s in schemas.SCHEMAS}


def _normalize(schema: SourceSchema, samples: list[tuple[str, dict[str, str], float]],
               admission: Admission) -> Snapshot:
    """The kept samples -> each series' values by role: every sample goes to what it feeds,
    then the histograms are assembled, SGLang's realtime tokens become hits and queries, and
    each series gets its engine's cache info and tiers."""
    page = _PageParts(schema, admission)
    for name, labels, value in samples:
        page.take(name, labels, value)
    page.assemble_histograms()
    page.realtime_hits()
    return page.snapshot()


class _PageParts:
    """What one page's kept samples add up to, per series, while they are read."""

    def __init__(self, schema: SourceSchema, admission: Admission) -> None:
        self.schema = schema
        self.admission = admission
        self.roles_by_sample, self.hist_roles = _ROLES[schema.schema]
        self.series: dict[SeriesKey, SeriesValues] = {}
        self.seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        self.buckets: dict[tuple[SeriesKey, str], dict[float, float]] = {}
        self.hist_sum: dict[tuple[SeriesKey, str], float] = {}
        self.hist_count: dict[tuple[SeriesKey, str], float] = {}
        self.realtime: dict[SeriesKey, dict[str, float]] = {}
        self.cache_info: dict[str, dict[str, str]] = {}
        tier_schema = _tier_schema(schema)
        self.tiers = _TierReader(schema.server, tier_schema) if tier_schema else None

    def take(self, name: str, labels: dict[str, str], value: float) -> None:
        """Route one sample: cache info, a tier family, realtime tokens, a role, a histogram."""
        ident = (name, tuple(sorted(labels.items())))
        if ident in self.seen:
            raise PageError("parse", f"duplicate series {name}{labels}")
        self.seen.add(ident)
        schema = self.schema
        key = _series_key(schema, labels)
        if key is None:
            return
        if name == schema.cache_config_info:
            # vLLM labels it with the engine index but not the model name.
            if key[1] in self.cache_info or len(self.cache_info) < self.admission.limits.max_series:
                self.cache_info[key[1]] = dict(labels)
            return
        if not self.admission.admit(key):
            return
        if self.tiers is not None and self.tiers.take(name, labels, value, key):
            return
        if name == schema.realtime_tokens:
            check_counter(name, value)
            mode = labels.get(schemas.SGLANG_MODE_LABEL, "")
            self.realtime.setdefault(key, {})[mode] = value
            return
        roles = self.roles_by_sample.get(name)
        if roles is not None:
            self._add_roles(name, value, key, roles)
            return
        hrole = self.hist_roles.get(name)
        if hrole is not None:
            self._add_histogram_sample(name, labels, value, key, hrole)

    def _add_roles(self, name: str, value: float, key: SeriesKey,
                   roles: list[tuple[str, str]]) -> None:
        """A sample of counter, created or gauge roles (engines of one series summed)."""
        values = self.series.setdefault(key, SeriesValues())
        for kind, role_name in roles:
            if kind == "counter":
                check_counter(name, value)
                values.counters[role_name] = values.counters.get(role_name, 0.0) + value
                check_counter(name, values.counters[role_name])
            elif kind == "created":
                if math.isfinite(value):
                    values.created[role_name] = value
            elif math.isfinite(value):
                values.gauges[role_name] = value

    def _add_histogram_sample(self, name: str, labels: dict[str, str], value: float,
                              key: SeriesKey, hrole: str) -> None:
        """A histogram's bucket, sum or count sample."""
        check_counter(name, value)
        hkey = (key, hrole)
        self.series.setdefault(key, SeriesValues())
        if name.endswith("_bucket"):
            try:
                bound = float(labels["le"])
            except (KeyError, ValueError) as exc:
                raise PageError("parse", f"bucket without a valid le: {name}") from exc
            bucket = self.buckets.setdefault(hkey, {})
            bucket[bound] = bucket.get(bound, 0.0) + value
        elif name.endswith("_sum"):
            self.hist_sum[hkey] = self.hist_sum.get(hkey, 0.0) + value
        else:
            self.hist_count[hkey] = self.hist_count.get(hkey, 0.0) + value

    def assemble_histograms(self) -> None:
        """Each histogram's buckets in order, ending with +Inf (over the bucket limit: left
        out and counted)."""
        for (key, hrole), bucket in self.buckets.items():
            if len(bucket) > self.admission.limits.max_buckets:
                self.admission.drop("too_many_series")  # every bucket is a series of ours
                continue
            bounds = tuple(sorted(bucket))
            if not bounds or not math.isinf(bounds[-1]):
                raise PageError("parse", f"histogram {hrole} has no +Inf bucket")
            counts = tuple(bucket[b] for b in bounds)
            count = self.hist_count.get((key, hrole), counts[-1])
            self.series[key].histograms[hrole] = Histogram(
                bounds, counts, self.hist_sum.get((key, hrole), 0.0), count)

    def realtime_hits(self) -> None:
        """SGLang's realtime tokens by mode as hits and queries, where no counter gave them."""
        for key, modes in self.realtime.items():
            values = self.series.setdefault(key, SeriesValues())
            cached = modes.get(schemas.SGLANG_MODE_CACHED)
            computed = modes.get(schemas.SGLANG_MODE_COMPUTED)
            if cached is not None and computed is not None and "hits" not in values.counters:
                values.counters["hits"] = cached
                values.counters["queries"] = cached + computed

    def snapshot(self) -> Snapshot:
        """The page's series, each with its engine's cache info and its tiers."""
        for key, values in self.series.items():
            values.cache_info = self.cache_info.get(key[1], {})
            if (self.schema.server == "sglang" and "queries" in values.counters
                    and "hits" not in values.counters
                    and (self.tiers is None or key not in self.tiers.sources)):
                # SGLang makes a cached-tokens child at a model's first cached token: none yet.
                values.counters["hits"] = 0.0
            if self.tiers is not None:
                self.tiers.fill(key, values)
        return Snapshot(self.schema, self.series)


class _TierReader:
    """The tier families of one page: cached tokens by source, the second tier's stores,
    occupancy and configuration, per series; ``fill`` turns them into counter roles."""

    def __init__(self, server: str, schema: TierSchema) -> None:
        self.server = server
        self.schema = schema
        self.sources: dict[SeriesKey, dict[str, float]] = {}
        self.stores: dict[SeriesKey, float] = {}
        self.used: dict[SeriesKey, float] = {}
        self.configured: set[SeriesKey] = set()
        self.store_names = {tiers.VLLM_OFFLOAD_SAVE_OUTCOMES, tiers.SGLANG_HICACHE_BACKUP_TOKENS}
        self.used_names = {tiers.VLLM_OFFLOAD_USED_BLOCKS, tiers.SGLANG_HICACHE_HOST_USED}
        self.config_names = {tiers.VLLM_OFFLOAD_INFO, tiers.SGLANG_HICACHE_HOST_TOTAL}
        self.others = schema.sample_names()

    def take(self, name: str, labels: dict[str, str], value: float, key: SeriesKey) -> bool:
        """Record a tier sample; True when no other role reads it. SGLang's cached tokens
        are also its hits: its device (and unsplit) sources go on to that role, its host and
        storage sources do not (the device ratio is the device pool's)."""
        if name == self.schema.cached_by_source:
            source = labels.get(self.schema.source_label)
            if source is None:
                return False  # an SGLang build without the split: the hits role reads it
            check_counter(name, value)
            by_source = self.sources.setdefault(key, {})
            by_source[source] = by_source.get(source, 0.0) + value
            if self.server == "sglang":
                return source not in (tiers.SGLANG_SOURCE_DEVICE, tiers.SGLANG_SOURCE_TOTAL)
            return True
        if name in self.store_names:
            check_counter(name, value)
            if labels.get(tiers.VLLM_OFFLOAD_OUTCOME_LABEL, tiers.VLLM_OFFLOAD_OUTCOME_STORED
                          ) == tiers.VLLM_OFFLOAD_OUTCOME_STORED:
                self.stores[key] = self.stores.get(key, 0.0) + value
            self.configured.add(key)
            return True
        if name in self.used_names:
            if math.isfinite(value):
                self.used[key] = self.used.get(key, 0.0) + value
            self.configured.add(key)
            return True
        if name in self.config_names:
            self.configured.add(key)
            return True
        # The rest of the tier families (loads, evictions...) are read by no role here; the
        # fallback and external counters are the schema's own roles.
        shared = (self.schema.fallback_device, self.schema.fallback_unknown,
                  self.schema.ext_queries)
        return name in self.others and name not in shared and not name.endswith("_created")

    def fill(self, key: SeriesKey, values: SeriesValues) -> None:
        """Every tier's cached tokens (by source when the page splits them, else the
        fallback: device = the engine's hits, unknown = a connector's hits)."""
        by_source = self.sources.get(key)
        if by_source is not None:
            split = tiers.tiers_from_sources(by_source, self.server)
            if self.server == "sglang" and "hits" in values.counters:
                # Unsplit (unlabelled) cached tokens of an older build: the device pool's.
                labelled_device = by_source.get(tiers.SGLANG_SOURCE_DEVICE, 0.0) + by_source.get(
                    tiers.SGLANG_SOURCE_TOTAL, 0.0)
                split[tiers.TIER_DEVICE] += max(values.counters["hits"] - labelled_device, 0.0)
        elif "hits" in values.counters:
            split = tiers.vllm_fallback_tiers(values.counters["hits"],
                                              values.counters.get("ext_hits"))
        else:
            return
        for tier, role in TIER_ROLES.items():
            values.counters[role] = split[tier]
        values.counters[CACHED] = sum(split.values())
        if key in self.stores:
            values.counters[TIER_STORES] = self.stores[key]
        if key in self.used:
            values.gauges[TIER_USED] = self.used[key]
        if key in self.configured:
            values.gauges[TIER_CONFIGURED] = 1.0

