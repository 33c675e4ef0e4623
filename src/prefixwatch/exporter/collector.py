"""client_python custom Collector: fresh metric families on every scrape of the exporter.

The poll loop does the work (history, window math); ``collect`` only turns each target's
latest view into families, so a scrape of the exporter never waits on a slow target.
"""

from __future__ import annotations

import math
import platform
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import MappingProxyType

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from prefixwatch.core.cache.requestledger import ratios as ledger_ratios
from prefixwatch.core.diagnosis import Diagnosis, RequestEvidence
from prefixwatch.core.story import Culprit
from prefixwatch.core.version import __version__
from prefixwatch.core.vocab import causes, exposition, families, tiers
from prefixwatch.core.vocab.exposition import OutMetric
from prefixwatch.core.vocab.schemas import SourceSchema
from prefixwatch.core.vocab.windows import ratio
from prefixwatch.exporter.evidence import served_tokens
from prefixwatch.exporter.kvsubscriber import KvSource
from prefixwatch.exporter.kvsubscriber.emit import add_families as add_kv_families
from prefixwatch.exporter.kvsubscriber.emit import add_ledger_families
from prefixwatch.exporter.kvsubscriber.whatif import add_whatif_families
from prefixwatch.exporter.monitor import TargetView, WindowFigures
from prefixwatch.exporter.pagereader import TIER_ROLES, Histogram, SeriesValues
from prefixwatch.exporter.requestlog.view import RequestView
from prefixwatch.exporter.routers.emit import add_router_families, router_views


class DiagnosisState:
    """The latest diagnosis, written by the poll loop after each round, read by scrapes."""

    def __init__(self, window: str) -> None:
        self.window = window
        self.lock = threading.Lock()
        self.diagnosis = Diagnosis()
        self.requests: dict[str, RequestEvidence] = {}
        self.kinds: dict[str, Counter[str]] = {}
        #: Each model's culprit over the diagnosis window (core/story.py), when one is known.
        self.culprits: dict[str, Culprit] = {}

    def update(self, diagnosis: Diagnosis, requests: dict[str, RequestEvidence],
               kinds: dict[str, Counter[str]]) -> None:
        with self.lock:
            self.diagnosis = diagnosis
            self.requests = requests
            self.kinds = kinds

    def latest(self) -> Diagnosis:
        """The latest diagnosis (replaced whole by each update, never changed in place)."""
        with self.lock:
            return self.diagnosis

    def latest_culprits(self) -> Mapping[str, Culprit]:
        """Each model's latest culprit, read-only (replaced whole by each round)."""
        with self.lock:
            return MappingProxyType(self.culprits)


_FAMILY_KINDS = {"counter": CounterMetricFamily, "histogram": HistogramMetricFamily,
                 "info": InfoMetricFamily}


def _family(metric: OutMetric) -> Metric:
    kind = _FAMILY_KINDS.get(metric.kind, GaugeMetricFamily)
    return kind(metric.name, metric.help, labels=list(metric.labels))


def _put(family: Callable[[OutMetric], Metric], metric: OutMetric, labels: list[str],
         value: float | None) -> None:
    """One sample, unless its value is undefined (a ratio without traffic is absent)."""
    if value is not None:
        family(metric).add_metric(labels, value)


def row_samples(row: families.Family, values: SeriesValues, schema: SourceSchema
                ) -> list[tuple[list[str], float | Histogram, float | None]]:
    """(extra label values, value, created) of one family-table row for one series: nothing
    when the page does not have it."""
    if row.extra == exposition.L_TIER:
        if not all(role in values.counters for role in TIER_ROLES.values()):
            return []
        created = values.created.get("hits")
        return [([tier], values.counters[TIER_ROLES[tier]], created) for tier in tiers.TIERS]
    found: float | Histogram | None = (values.counters if row.kind == "counter" else
                                       values.gauges if row.kind == "gauge" else
                                       values.histograms).get(row.role)
    if found is None:
        return []
    extra = [schema.read(row.role) or ""] if row.extra == exposition.L_SOURCE else []
    return [(extra, found, values.created.get(row.role))]


class PrefixwatchCollector(Collector):
    """The exporter's families, from the targets' views as they are when a scrape comes in:
    ``views`` returns each target's latest (no target's lock is taken)."""

    def __init__(self, views: Callable[[], Sequence[TargetView]], windows: dict[str, float],
                 state: DiagnosisState | None = None, view: RequestView | None = None) -> None:
        self.views = views
        self.windows = windows
        self.state = state
        self.view = view
        #: The model a requests log belongs to (None: every model the targets serve).
        self.view_model: str | None = None
        self.round_seconds: float | None = None  # set by the poll loop
        #: The KV event sources (exporter/kvsubscriber), when any target has a stream.
        self.kv_sources: Callable[[], list[KvSource]] | None = None
        #: Their ledgers (exporter/kvsubscriber/ledgerseries.py): the ledger of every model they
        #: serve.
        self.kv_ledgers = None

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: families vary with what the targets show

    def collect(self) -> Iterator[Metric]:
        fam: dict[str, Metric] = {}

        def family(metric: OutMetric) -> Metric:
            if metric.name not in fam:
                fam[metric.name] = _family(metric)
            return fam[metric.name]

        build = family(exposition.OUT_BUILD_INFO)
        build.add_metric([], dict(zip(exposition.OUT_BUILD_INFO.info_keys,
                                      (__version__, platform.python_version()), strict=True)))
        if self.round_seconds is not None:
            family(exposition.OUT_ROUND_DURATION).add_metric([], self.round_seconds)
        for metric in (exposition.OUT_TARGET_UP, exposition.OUT_SCRAPE_DURATION,
                       exposition.OUT_SCRAPE_ERRORS, exposition.OUT_LAST_SUCCESS,
                       exposition.OUT_TARGET_INFO, exposition.OUT_HIT_RATIO,
                       exposition.OUT_FLEET_HIT_RATIO, exposition.OUT_EFFECTIVE_HIT_RATIO,
                       exposition.OUT_FLEET_EFFECTIVE_HIT_RATIO):
            family(metric)  # always present, even with no data, so dashboards see the names

        views = self.views()
        fleet: dict[tuple[str, str], list[WindowFigures]] = {}
        for target in views:
            self._collect_target(target, family, fleet)
        for (model, window), figures in sorted(fleet.items()):
            total = WindowFigures.summed(figures)
            _put(family, exposition.OUT_FLEET_HIT_RATIO, [model, window], total.hit_ratio)
            _put(family, exposition.OUT_FLEET_EFFECTIVE_HIT_RATIO, [model, window],
                 total.effective_ratio)
        if self.state is not None:
            self._collect_diagnosis(family, {v.name for v in views if v.up})
        evented: set[str] = set()
        if self.kv_sources is not None:
            add_kv_families(family, self.kv_sources())
        if self.kv_ledgers is not None:
            evented = add_ledger_families(family, self.kv_ledgers, self.windows)
            add_whatif_families(family, self.kv_ledgers)
        if self.view is not None:
            self._collect_requests(family, views, evented)
        add_router_families(family, router_views(views))
        yield from fam.values()

    def _collect_diagnosis(self, family, up: set[str]) -> None:
        assert self.state is not None
        diag = family(exposition.OUT_DIAGNOSIS)
        with self.state.lock:
            for (target, model), held in sorted(self.state.diagnosis.causes.items()):
                if target not in up:
                    continue  # a target that is down has no diagnosis, only up=0
                for cause in causes.CAUSE_NAMES:
                    diag.add_metric([target, model, cause], 1.0 if held.get(cause) else 0.0)
            window = self.state.window
            culprit = family(exposition.OUT_CULPRIT)
            for model, found in sorted(self.state.culprits.items()):
                culprit.add_metric([model, found.kind, str(found.position), found.words],
                                   found.share)
            for model, req in sorted(self.state.requests.items()):
                _put(family, exposition.OUT_ACHIEVABLE, [model, window], req.achievable)
                kinds = self.state.kinds.get(model, Counter())
                per_kind = family(exposition.OUT_DIVERGENCE_KIND)
                for kind in exposition.DIVERGENCE_KINDS:
                    per_kind.add_metric([model, window, kind], float(kinds.get(kind, 0)))
                if kinds:
                    top = max(exposition.DIVERGENCE_KINDS, key=lambda k: kinds.get(k, 0))
                    family(exposition.OUT_DIVERGENCE_TOP_KIND).add_metric([model, window, top], 1.0)

    def _collect_requests(self, family, views: Sequence[TargetView],
                          evented: set[str] = frozenset()) -> None:
        assert self.view is not None
        lines = family(exposition.OUT_REQUESTS_LOG_LINES)
        for result in exposition.REQUESTS_LOG_RESULTS:
            lines.add_metric([result], float(self.view.lines.get(result, 0)))
        held, blocks = self.view.window_size()
        family(exposition.OUT_REQUESTS_WINDOW).add_metric([], float(held))
        family(exposition.OUT_REQUESTS_WINDOW_BLOCKS).add_metric([], float(blocks))
        buckets, total = self.view.histogram()
        models = ([self.view_model] if self.view_model else
                  sorted(self.state.requests) if self.state is not None else [])
        for model in models:
            family(exposition.OUT_DIVERGENCE).add_metric([model], buckets, total)
        self._collect_ledger(family, views, [m for m in models if m not in evented])

    def _collect_ledger(self, family, views: Sequence[TargetView], models: list[str]) -> None:
        """The ledger's counters, and its window shares with the engines' cached tokens."""
        assert self.view is not None
        totals, unmeasured = self.view.ledger_totals()
        tokens = family(exposition.OUT_LEDGER_TOKENS)
        shares = family(exposition.OUT_LEDGER_RATIO)
        for model in models:
            for part in exposition.LEDGER_COUNTED:
                if part not in unmeasured:
                    tokens.add_metric([model, part], float(getattr(totals, part)))
        for window, seconds in self.windows.items():
            parts, unmeasured = self.view.ledger_window(seconds)
            for model in models:
                achieved = parts.achieved
                if achieved is None:
                    achieved = served_tokens(views, window, model)
                if achieved is None:
                    continue
                for part, value in ledger_ratios(parts, achieved).items():
                    if part not in unmeasured:
                        shares.add_metric([model, window, part], value)

    def _collect_target(self, view: TargetView, family, fleet) -> None:
        t = view.name
        family(exposition.OUT_TARGET_UP).add_metric([t], 1.0 if view.up else 0.0)
        if not math.isnan(view.scrape_duration):
            family(exposition.OUT_SCRAPE_DURATION).add_metric([t], view.scrape_duration)
        if not math.isnan(view.last_success):
            family(exposition.OUT_LAST_SUCCESS).add_metric([t], view.last_success)
        errors = family(exposition.OUT_SCRAPE_ERRORS)
        for reason in exposition.SCRAPE_ERROR_REASONS:
            errors.add_metric([t, reason], float(view.errors.get(reason, 0)))
        schema = view.schema
        if not view.up or schema is None:
            return
        server = schema.server
        family(exposition.OUT_TARGET_INFO).add_metric(
            [t], dict(zip(exposition.OUT_TARGET_INFO.info_keys, (server, schema.schema),
                          strict=True)))

        for (model, engine), state in sorted(view.series.items()):
            labels = [t, model, engine, server]
            values = state.values
            for row in families.FAMILIES:
                for extra, value, created in row_samples(row, values, schema):
                    if isinstance(value, Histogram):
                        buckets = [(floatToGoString(b), c)
                                   for b, c in zip(value.bounds, value.counts, strict=True)]
                        family(row.out).add_metric(labels, buckets, value.sum)
                    elif row.kind == "counter":
                        family(row.out).add_metric(labels + extra, value, created=created)
                    else:
                        family(row.out).add_metric(labels + extra, value)
            if values.block_size is not None:
                family(exposition.OUT_BLOCK_SIZE).add_metric(labels, float(values.block_size))
            if values.caching_enabled is not None:
                family(exposition.OUT_CACHING_ENABLED).add_metric(
                    labels, 1.0 if values.caching_enabled else 0.0)

        for model, figures in sorted(view.models.items()):
            base = [t, model, server]
            life = base + [exposition.LIFETIME_WINDOW]
            _put(family, exposition.OUT_HIT_RATIO, life,
                 ratio(figures.lifetime_hits, figures.lifetime_queries))
            _put(family, exposition.OUT_EFFECTIVE_HIT_RATIO, life, figures.lifetime_effective)
            for window, wf in figures.windows.items():
                _put(family, exposition.OUT_HIT_RATIO, base + [window], wf.hit_ratio)
                if wf.hit_ratio is not None or wf.queries == 0:
                    fleet.setdefault((model, window), []).append(wf)
                _put(family, exposition.OUT_EFFECTIVE_HIT_RATIO, base + [window],
                     wf.effective_ratio)
                if wf.seconds > 0 and not math.isnan(wf.hits):
                    family(exposition.OUT_CACHED_TOKENS_RATE).add_metric(
                        base + [window], wf.hits / wf.seconds)
                    family(exposition.OUT_QUERY_RATE).add_metric(
                        base + [window], wf.queries / wf.seconds)
                for q in exposition.TTFT_QUANTILES:
                    _put(family, exposition.OUT_TTFT_QUANTILE, base + [window, floatToGoString(q)],
                         wf.ttft_quantile(q))
