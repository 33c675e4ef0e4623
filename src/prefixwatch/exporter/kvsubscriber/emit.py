"""The KV event series, as rows: one reading of every source per scrape (or OTLP export).

``rows`` is the one place that turns a source's state into (family, labels, value); the
Prometheus collector and the OTLP bridge both read it, so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prefixwatch.core.kv.codec import EVENT_TYPES
from prefixwatch.core.vocab import exposition
from prefixwatch.core.vocab.exposition import OutMetric
from prefixwatch.exporter.kvsubscriber import error_reasons
from prefixwatch.exporter.kvsubscriber.source import KvSource

#: Families written for every source, present even before its first message.
ALWAYS: tuple[OutMetric, ...] = (exposition.OUT_KV_EVENTS_UP, exposition.OUT_KV_EVENTS,
                                 exposition.OUT_KV_EVENTS_ERRORS, exposition.OUT_KV_EVENTS_LOST,
                                 exposition.OUT_KV_BLOCKS, exposition.OUT_KV_RESIDENT)


@dataclass(frozen=True)
class Row:
    metric: OutMetric
    labels: list[str]
    #: A number, or for histograms ``(cumulative [(bound, count)], sum)``.
    value: Any


def rows(sources: Iterable[KvSource]) -> Iterator[Row]:
    for source in sources:
        stream = source.view()
        t, snap = stream.target, stream.snapshot
        yield Row(exposition.OUT_KV_EVENTS_UP, [t], 1.0 if stream.up else 0.0)
        yield Row(exposition.OUT_KV_EVENTS_LOST, [t], float(stream.lost))
        for reason, n in error_reasons(stream.errors):
            yield Row(exposition.OUT_KV_EVENTS_ERRORS, [t, reason], float(n))
        events = snap.events if snap is not None else {}
        for kind in EVENT_TYPES:
            yield Row(exposition.OUT_KV_EVENTS, [t, kind], float(events.get(kind, 0)))
        if snap is None:
            continue
        media = sorted(set(snap.stored) | set(snap.removed) | set(snap.resident))
        stored, removed = exposition.KV_BLOCK_OPS
        for medium in media:
            yield Row(exposition.OUT_KV_BLOCKS, [t, medium, stored],
                      float(snap.stored.get(medium, 0)))
            yield Row(exposition.OUT_KV_BLOCKS, [t, medium, removed],
                      float(snap.removed.get(medium, 0)))
            yield Row(exposition.OUT_KV_RESIDENT, [t, medium], float(snap.resident.get(medium, 0)))
        for medium, hist in sorted(snap.lifetimes.items()):
            yield Row(exposition.OUT_KV_LIFETIME, [t, medium], hist)
        model = snap.model
        for part in exposition.KV_COMPUTED_PARTS:
            yield Row(exposition.OUT_KV_COMPUTED, [t, model, part], float(snap.computed[part]))
        yield Row(exposition.OUT_KV_COMPUTED, [t, model, exposition.LEDGER_TAIL],
                  float(stream.tail_tokens))
        for medium, tokens in sorted(snap.loaded.items()):
            yield Row(exposition.OUT_KV_LOADED, [t, model, medium], float(tokens))
        if snap.divergence[0][-1][1]:
            yield Row(exposition.OUT_KV_DIVERGENCE, [t, model], snap.divergence)
        for kind, n in sorted(stream.kinds.items()):
            yield Row(exposition.OUT_KV_DIVERGENCE_KIND, [t, model, kind], float(n))


def add_families(family, sources: Iterable[KvSource]) -> None:
    """Add every source's rows to the collector's families (``family(metric)`` -> Metric)."""
    from prometheus_client.utils import floatToGoString

    for metric in ALWAYS:
        family(metric)
    for row in rows(sources):
        fam = family(row.metric)
        if row.metric.kind == "histogram":
            buckets, total = row.value
            fam.add_metric(row.labels, [(floatToGoString(b), c) for b, c in buckets], total)
        else:
            fam.add_metric(row.labels, row.value)


def add_ledger_families(family, ledgers, windows: dict[str, float]) -> set[str]:
    """The ledger families (prefixwatch_ledger_*) of every model with an event source: its
    counters since the exporter followed the streams, its shares per window; returns those
    models (the request log's ledger stands aside for them)."""
    from prefixwatch.core.kv.eventledger import EVENT_COUNTED, event_counted

    models = ledgers.models()
    tokens = family(exposition.OUT_LEDGER_TOKENS)
    shares = family(exposition.OUT_LEDGER_RATIO)
    for model in sorted(models):
        total = ledgers.model_span(model, None)
        if total is not None:
            counted = ledgers.counters(model, event_counted(total.shares, total.prompt))
            for part in EVENT_COUNTED:
                tokens.add_metric([model, part], float(counted[part]))
        for window, seconds in windows.items():
            span = ledgers.model_span(model, seconds)
            if span is None or span.prompt <= 0:
                continue
            for part in exposition.KV_LEDGER_SHARES:
                shares.add_metric([model, window, part], span.shares[part] / span.prompt)
    return set(models)
