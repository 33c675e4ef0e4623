"""OTLP/HTTP export of the same families /metrics shows, through opentelemetry-sdk's exporter.

After each poll round the bridge collects the exporter's own collector (exporter/collector.py:
the families /metrics shows, the event ledger's and the request view's among them, so OTLP can
never show another number or miss a family) and sends them as one OTLP request: each target is
its own OpenTelemetry *resource* (``service.name=prefixwatch``, ``prefixwatch.target=<target>``)
holding the samples labelled with that target, the label itself dropped; the samples of no
target (the fleet's ratios, the ledger, the request log, the build) go in the exporter's own
resource, last. Counters become cumulative monotonic sums (started at the engine's
``_created`` time when it has one), histograms explicit-bucket histograms, gauges and info
families gauges; units follow Prometheus' suffix convention (``_seconds`` s, ``_ratio`` 1).
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from prometheus_client.core import Metric as PromMetric

from prefixwatch.core.version import __version__
from prefixwatch.core.vocab import exposition
from prefixwatch.exporter.collector import PrefixwatchCollector

log = logging.getLogger("prefixwatch.otlp")

_SCOPE = InstrumentationScope("prefixwatch", __version__)
_STARTED_NS = time.time_ns()


def metrics_endpoint(endpoint: str) -> str:
    """Accept either the collector's base URL or the full /v1/metrics URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/metrics") else endpoint + "/v1/metrics"


def unit_of(name: str) -> str:
    """The UCUM unit Prometheus' naming convention implies ('' when it implies none)."""
    for suffix, unit in (("_seconds", "s"), ("_ratio", "1"), ("_tokens", "{token}")):
        if name.endswith(suffix):
            return unit
    return ""


class OtlpBridge:
    """Sends what ``collector`` (the exporter's own, the one /metrics serves) yields."""

    def __init__(self, collector: PrefixwatchCollector, endpoint: str,
                 timeout: float = 10.0) -> None:
        self.endpoint = metrics_endpoint(endpoint)
        self.timeout = timeout
        self.collector = collector
        self._own = {"service.name": "prefixwatch", "service.version": __version__,
                     "service.instance.id": socket.gethostname()}
        self._resources: dict[str | None, Resource] = {view.name: Resource.create({
            **self._own, "prefixwatch.target": view.name, "url.full": view.target.display_url,
        }) for view in collector.views()}
        self._exporter = OTLPMetricExporter(endpoint=self.endpoint, timeout=timeout)
        self._failing = False

    def metrics_data(self, now_ns: int | None = None) -> MetricsData:
        """The collector's families, one resource per target and the exporter's own last."""
        now_ns = now_ns or time.time_ns()
        by_target: dict[str | None, list[Metric]] = {name: [] for name in self._resources}
        for family in self.collector.collect():
            for target, metric in _convert(family, now_ns).items():
                by_target.setdefault(target, []).append(metric)
        by_target[None] = by_target.pop(None, [])  # last
        return MetricsData([
            ResourceMetrics(self._resource(target), [ScopeMetrics(_SCOPE, metrics, "")], "")
            for target, metrics in by_target.items()])

    def _resource(self, target: str | None) -> Resource:
        """A configured target's; the exporter's own for None, or for a stream no target
        owns (listen mode's unrouted topics), named by its label."""
        known = self._resources.get(target)
        if known is None:
            extra = {} if target is None else {"prefixwatch.target": target}
            known = self._resources[target] = Resource.create({**self._own, **extra})
        return known

    def export(self) -> None:
        """Push one round; called by the exporter after each poll round."""
        try:
            ok = self._exporter.export(self.metrics_data(), timeout_millis=self.timeout * 1000
                                       ) is MetricExportResult.SUCCESS
        except Exception:  # a collector that answers nonsense must not stop the poll loop
            log.debug("OTLP export raised", exc_info=True)
            ok = False
        if ok and self._failing:
            log.info("OTLP export to %s works again", self.endpoint)
        elif not ok and not self._failing:
            log.warning("OTLP export to %s failed; will keep trying each round", self.endpoint)
        self._failing = not ok

    def shutdown(self, budget: float = 0.5) -> None:
        """Stop the exporter within ``budget`` seconds (SIGTERM ends the process within 2 s,
        whether the collector answers or not): a daemon thread given up after the budget
        cannot hold the process."""
        def run() -> None:
            try:
                self._exporter.shutdown(timeout_millis=budget * 1000)
            except Exception:
                log.debug("OTLP exporter shutdown failed", exc_info=True)

        thread = threading.Thread(target=run, name="otlp-shutdown", daemon=True)
        thread.start()
        thread.join(budget)


def _convert(family: PromMetric, now_ns: int) -> dict[str | None, Metric]:
    """One client_python family as an OTLP metric per target (None: the samples of none)."""
    points: dict[str | None, dict[tuple, dict]] = {}
    for sample in family.samples:
        labels = dict(sample.labels)
        target = labels.pop(exposition.L_TARGET, None)
        le = labels.pop("le", None)
        key = tuple(sorted(labels.items()))
        point = points.setdefault(target, {}).setdefault(key, {"buckets": []})
        suffix = sample.name.removeprefix(family.name)
        if le is not None:
            point["buckets"].append((float(le), sample.value))
        elif suffix == "_created":
            point["created"] = sample.value
        else:
            point[suffix or "value"] = sample.value
    out = {}
    for target, by_key in points.items():
        data = _data(family.type, by_key, now_ns)
        if data is not None:
            out[target] = Metric(family.name, family.documentation, unit_of(family.name), data)
    return out

def _data(kind: str, by_key: dict[tuple, dict], now_ns: int) -> Sum | Gauge | Histogram | None:
    def start(point: dict) -> int:
        created = point.get("created")
        return int(created * 1e9) if created else _STARTED_NS

    if kind == "histogram":
        hist = []
        for key, p in by_key.items():
            bounds = [b for b, _ in sorted(p["buckets"])]
            cumulative = [c for _, c in sorted(p["buckets"])]
            counts = [int(c - prev) for c, prev in zip(cumulative, [0.0, *cumulative[:-1]],
                                                        strict=True)]
            hist.append(HistogramDataPoint(dict(key), start(p), now_ns, int(p.get("_count", 0)),
                                           p.get("_sum", 0.0), counts, bounds[:-1],
                                           None, None))  # type: ignore[arg-type]
        return Histogram(hist, AggregationTemporality.CUMULATIVE)
    value = "_total" if kind == "counter" else "_info" if kind == "info" else "value"
    numbers = [NumberDataPoint(dict(key), start(p), now_ns, p[value])
               for key, p in by_key.items() if value in p]
    if not numbers:
        return None
    if kind == "counter":
        return Sum(numbers, AggregationTemporality.CUMULATIVE, True)
    return Gauge(numbers)
