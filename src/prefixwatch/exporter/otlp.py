"""OTLP/HTTP export of the same figures, through opentelemetry-sdk.

One MeterProvider per target, so each target is its own OpenTelemetry *resource*
(``service.name=prefixwatch``, ``prefixwatch.target=<target>``). The providers have no timer
of their own: the exporter flushes them after each poll round, so OTLP sees exactly the
figures of that round.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from prefixwatch.core import causes, names, tiers
from prefixwatch.core.version import __version__
from prefixwatch.core.windows import ratio
from prefixwatch.exporter.collector import DiagnosisState
from prefixwatch.exporter.kvevents import KvSource
from prefixwatch.exporter.kvevents.emit import rows as kv_rows
from prefixwatch.exporter.monitor import TargetMonitor
from prefixwatch.exporter.pagereader import TIER_ROLES

log = logging.getLogger("prefixwatch.otlp")

_COUNTER_ROLES = (
    ("queries", names.OUT_QUERIES), ("hits", names.OUT_HITS),
    ("ext_queries", names.OUT_EXT_QUERIES), ("ext_hits", names.OUT_EXT_HITS),
    ("prompt_tokens", names.OUT_PROMPT_TOKENS),
    ("preemptions", names.OUT_PREEMPTIONS),
)


def metrics_endpoint(endpoint: str) -> str:
    """Accept either the collector's base URL or the full /v1/metrics URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/metrics") else endpoint + "/v1/metrics"


class OtlpBridge:
    def __init__(self, monitors: Iterable[TargetMonitor], endpoint: str,
                 timeout: float = 10.0, state: DiagnosisState | None = None,
                 kv_sources: dict[str, KvSource] | None = None) -> None:
        self.endpoint = metrics_endpoint(endpoint)
        self.state = state
        self.kv_sources = kv_sources or {}
        self._providers: list[MeterProvider] = []
        for mon in monitors:
            resource = Resource.create({
                "service.name": "prefixwatch",
                "service.version": __version__,
                "service.instance.id": socket.gethostname(),
                "prefixwatch.target": mon.name,
                "url.full": mon.target.display_url,
            })
            reader = PeriodicExportingMetricReader(
                OTLPMetricExporter(endpoint=self.endpoint, timeout=timeout),
                export_interval_millis=math.inf)
            provider = MeterProvider(resource=resource, metric_readers=[reader])
            self._register(provider, mon)
            self._providers.append(provider)
        self._failing = False

    def _register(self, provider: MeterProvider, mon: TargetMonitor) -> None:
        meter = provider.get_meter("prefixwatch", __version__)
        for role, metric in _COUNTER_ROLES:
            meter.create_observable_counter(
                metric.name, callbacks=[_counter_callback(mon, role)], unit="{token}"
                if "preempt" not in role else "{preemption}", description=metric.help)
        meter.create_observable_counter(
            names.OUT_PROMPT_TOKENS_CACHED_BY_TIER.name, callbacks=[_tier_callback(mon)],
            unit="{token}", description=names.OUT_PROMPT_TOKENS_CACHED_BY_TIER.help)
        meter.create_observable_gauge(
            names.OUT_HIT_RATIO.name, callbacks=[_ratio_callback(mon)], unit="1",
            description=names.OUT_HIT_RATIO.help)
        meter.create_observable_gauge(
            names.OUT_EFFECTIVE_HIT_RATIO.name, unit="1",
            callbacks=[_ratio_callback(mon, effective=True)],
            description=names.OUT_EFFECTIVE_HIT_RATIO.help)
        meter.create_observable_gauge(
            names.OUT_TTFT_QUANTILE.name, callbacks=[_ttft_callback(mon)], unit="s",
            description=names.OUT_TTFT_QUANTILE.help)
        meter.create_observable_gauge(
            names.OUT_TARGET_UP.name, unit="1", description=names.OUT_TARGET_UP.help,
            callbacks=[lambda _o, m=mon: [Observation(1.0 if m.up else 0.0)]])
        source = self.kv_sources.get(mon.name)
        if source is not None:
            _register_kv(meter, source)
        if self.state is not None:
            meter.create_observable_gauge(
                names.OUT_DIAGNOSIS.name, unit="1", description=names.OUT_DIAGNOSIS.help,
                callbacks=[_diagnosis_callback(mon, self.state)])

    def export(self) -> None:
        """Push one round; called by the exporter after each poll round."""
        ok = all(provider.force_flush(timeout_millis=15000) for provider in self._providers)
        if ok and self._failing:
            log.info("OTLP export to %s works again", self.endpoint)
        elif not ok and not self._failing:
            log.warning("OTLP export to %s failed; will keep trying each round", self.endpoint)
        self._failing = not ok

    def shutdown(self, budget: float = 0.5) -> None:
        """Stop the providers within ``budget`` seconds in all (SIGTERM ends the process
        within 2 s, whether the collector answers or not)."""
        deadline = time.monotonic() + budget

        def run() -> None:
            for provider in self._providers:
                left = max(1.0, (deadline - time.monotonic()) * 1000)
                try:
                    provider.shutdown(timeout_millis=left)
                except Exception:  # a collector that is down must not delay the exit
                    log.debug("OTLP provider shutdown failed", exc_info=True)

        # The final export may wait on a silent collector longer than asked: a daemon
        # thread given up after the budget cannot hold the process.
        thread = threading.Thread(target=run, name="otlp-shutdown", daemon=True)
        thread.start()
        thread.join(budget)


Callback = Callable[[CallbackOptions], list[Observation]]

#: The KV event families as OTLP instruments (histograms are the Prometheus side's only).
_KV_INSTRUMENTS = (names.OUT_KV_EVENTS_UP, names.OUT_KV_EVENTS, names.OUT_KV_EVENTS_ERRORS,
                   names.OUT_KV_EVENTS_LOST, names.OUT_KV_BLOCKS, names.OUT_KV_RESIDENT,
                   names.OUT_KV_COMPUTED, names.OUT_KV_LOADED, names.OUT_KV_DIVERGENCE_KIND)


def _register_kv(meter, source: KvSource) -> None:
    """One instrument per KV event family of the target, read from the same rows as the
    Prometheus side (exporter/kvevents/emit.py); the target is the resource, not a label."""
    for metric in _KV_INSTRUMENTS:
        def observe(_options: CallbackOptions, metric=metric) -> list[Observation]:
            return [Observation(row.value, dict(zip(metric.labels[1:], row.labels[1:],
                                                    strict=True)))
                    for row in kv_rows([source]) if row.metric is metric]
        unit = "{block}" if "block" in metric.name else "{token}" if "token" in metric.name \
            else "1"
        if metric.kind == "counter":
            meter.create_observable_counter(metric.name, callbacks=[observe], unit=unit,
                                            description=metric.help)
        else:
            meter.create_observable_gauge(metric.name, callbacks=[observe], unit=unit,
                                          description=metric.help)


def _counter_callback(mon: TargetMonitor, role: str) -> Callback:
    def observe(_options: CallbackOptions) -> list[Observation]:
        with mon.lock:
            if not mon.up or mon.snapshot is None:
                return []
            server = mon.snapshot.schema.server
            return [Observation(s.values.counters[role], {
                names.L_MODEL: model, names.L_ENGINE: engine, names.L_SERVER: server})
                for (model, engine), s in mon.series.items() if role in s.values.counters]
    return observe


def _tier_callback(mon: TargetMonitor) -> Callback:
    """Cached prompt tokens of every series by tier (all five, as on /metrics)."""
    def observe(_options: CallbackOptions) -> list[Observation]:
        with mon.lock:
            if not mon.up or mon.snapshot is None:
                return []
            server = mon.snapshot.schema.server
            return [Observation(s.values.counters[TIER_ROLES[tier]], {
                names.L_MODEL: model, names.L_ENGINE: engine, names.L_SERVER: server,
                names.L_TIER: tier})
                for (model, engine), s in mon.series.items()
                if all(r in s.values.counters for r in TIER_ROLES.values())
                for tier in tiers.TIERS]
    return observe


def _ratio_callback(mon: TargetMonitor, effective: bool = False) -> Callback:
    """The device ratio per window (or, ``effective``, the share served from any tier)."""
    def observe(_options: CallbackOptions) -> list[Observation]:
        out: list[Observation] = []
        with mon.lock:
            if not mon.up:
                return out
            for model, figures in mon.models.items():
                lifetime = (figures.lifetime_effective if effective else
                            ratio(figures.lifetime_hits, figures.lifetime_queries))
                if lifetime is not None:
                    out.append(Observation(lifetime, {names.L_MODEL: model,
                                                      names.L_WINDOW: names.LIFETIME_WINDOW}))
                for window, wf in figures.windows.items():
                    value = wf.effective_ratio if effective else wf.hit_ratio
                    if value is not None:
                        out.append(Observation(value, {names.L_MODEL: model,
                                                       names.L_WINDOW: window}))
        return out
    return observe


def _ttft_callback(mon: TargetMonitor) -> Callback:
    def observe(_options: CallbackOptions) -> list[Observation]:
        out: list[Observation] = []
        with mon.lock:
            if not mon.up:
                return out
            for model, figures in mon.models.items():
                for window, wf in figures.windows.items():
                    for q in names.TTFT_QUANTILES:
                        value = wf.ttft_quantile(q)
                        if value is not None:
                            out.append(Observation(value, {
                                names.L_MODEL: model, names.L_WINDOW: window,
                                names.L_QUANTILE: str(q)}))
        return out
    return observe


def _diagnosis_callback(mon: TargetMonitor, state: DiagnosisState) -> Callback:
    def observe(_options: CallbackOptions) -> list[Observation]:
        if not mon.up:
            return []
        with state.lock:
            return [Observation(1.0 if held.get(cause) else 0.0,
                                {names.L_MODEL: model, names.L_CAUSE: cause})
                    for (target, model), held in state.diagnosis.causes.items()
                    if target == mon.name for cause in causes.CAUSE_NAMES]
    return observe
