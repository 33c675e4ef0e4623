"""One router's /metrics page -> what it counted: requests per worker, decisions per policy,
predicted hits over lookups, and the problems of its KV event feed.

The page is cut to the samples its router kind's schema (core/vocab/routers.py) reads, under the
target's limits, as an engine's is (exporter/pagescan.py). What cannot be used is counted by
reason, never raised: a label value this release does not know (a newer router), a family of
another type than expected, a page of the router's with none of the families read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prefixwatch.core.vocab import routers
from prefixwatch.core.vocab.routers import Prediction, RouterSchema
from prefixwatch.exporter.pagescan import (
    LabelCache,
    PageError,
    PageLimits,
    check_counter,
    parse_value,
    select_samples,
)


@dataclass(frozen=True)
class RouterReading:
    """What one page of a router said (cumulative counts, as the router exports them); it
    never changes once read (a target's view holds it)."""

    kind: str
    #: Every worker URL the page names, in page order.
    workers: tuple[str, ...] = ()
    worker_requests: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    decisions: Mapping[str, float] = field(default_factory=lambda: _EMPTY)
    #: Prediction source -> (predicted hits, predictions).
    predictions: Mapping[str, tuple[float, float]] = field(default_factory=lambda: _EMPTY)
    #: (worker, problem) -> count.
    feed: Mapping[tuple[str, str], float] = field(default_factory=lambda: _EMPTY)
    #: What the page could not give, by reason (this page's counts).
    errors: Mapping[str, int] = field(default_factory=lambda: _EMPTY)


_EMPTY: Mapping = MappingProxyType({})


@dataclass
class _Draft:
    """A reading while the page is read."""

    kind: str
    #: Every worker URL the page names, in page order.
    workers: list[str] = field(default_factory=list)
    worker_requests: dict[str, float] = field(default_factory=dict)
    decisions: dict[str, float] = field(default_factory=dict)
    #: Prediction source -> (predicted hits, predictions).
    predictions: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: (worker, problem) -> count.
    feed: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def count(self, reason: str) -> None:
        self.errors[reason] = self.errors.get(reason, 0) + 1

    def freeze(self) -> RouterReading:
        return RouterReading(
            self.kind, tuple(self.workers), MappingProxyType(self.worker_requests),
            MappingProxyType(self.decisions), MappingProxyType(self.predictions),
            MappingProxyType(self.feed), MappingProxyType(self.errors))


#: A count exported as a gauge is still a count (production-stack writes its counts so).
_EXPECTED_TYPE = {"counter": ("counter", "gauge", "unknown", "untyped"),
                  "histogram": ("histogram",), "gauge": ("gauge", "unknown", "untyped")}


def _types(text: str, wanted: set[str]) -> dict[str, str]:
    """family -> its # TYPE, for the families read."""
    out = {}
    for line in text.split("\n"):
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4 and parts[2] in wanted:
                out[parts[2]] = parts[3]
    return out


class _Samples:
    """The kept sample lines of one page, by name, labels parsed (memoised)."""

    def __init__(self, text: str, schema: RouterSchema, labels: LabelCache,
                 limits: PageLimits, reading: _Draft) -> None:
        self.by_name: dict[str, list[tuple[dict[str, str], float]]] = {}
        for name, block, rest in select_samples(text, schema.sample_names()):
            value = parse_value(name, rest)
            parsed = labels.parse(block)
            if any(len(v) > limits.max_label_length for v in parsed.values()):
                reading.count("label_too_long")
                continue
            self.by_name.setdefault(name, []).append((parsed, value))

    def get(self, name: str) -> list[tuple[dict[str, str], float]]:
        return self.by_name.get(name, [])


def read_router_page(text: str, schema: RouterSchema | None = None,
                     labels: LabelCache | None = None,
                     limits: PageLimits | None = None) -> RouterReading:
    """Read a router's page (its kind detected when ``schema`` is None). Raises PageError
    (not_metrics) for a page that is no router's, or (invalid_value, parse) for one that
    cannot be trusted; everything else is counted in ``errors``."""
    schema = schema or routers.detect(text)
    if schema is None:
        raise PageError("not_metrics", "no router family on the page (vllm_router_*, smg_*, "
                                       "llm_d_epp_*, dynamo_*, vllm:routing_decisions_total)")
    limits = limits or PageLimits()
    reading = _Draft(schema.kind)
    samples = _Samples(text, schema, labels or LabelCache(), limits, reading)
    if not samples.by_name:
        reading.count("no_known_family")
        return reading.freeze()
    read = schema.sample_names()
    types = _types(text, read | {s.removesuffix("_total") for s in read}
                   | {s.removesuffix("_sum") for s in read})
    _workers(samples, schema, reading, limits)
    _decisions(samples, schema, reading, types)
    for prediction in schema.predictions:
        _prediction(samples, prediction, reading, types)
    for problem in schema.feed:
        for labels_, value in samples.get(problem.sample):
            check_counter(problem.sample, value)
            worker = labels_.get(schema.worker_label, "")
            if _admit(worker, reading, limits):
                key = (worker, problem.problem)
                reading.feed[key] = reading.feed.get(key, 0.0) + value
    return reading.freeze()


def _admit(worker: str, reading: _Draft, limits: PageLimits) -> bool:
    if not worker or worker in reading.workers:
        return True
    if len(reading.workers) >= limits.max_series:
        reading.count("too_many_series")
        return False
    reading.workers.append(worker)
    return True


def _workers(samples: _Samples, schema: RouterSchema, reading: _Draft,
             limits: PageLimits) -> None:
    for labels_, _value in samples.get(schema.worker_list):
        _admit(labels_.get(schema.worker_label, ""), reading, limits)
    for labels_, value in samples.get(schema.worker_requests):
        check_counter(schema.worker_requests, value)
        worker = labels_.get(schema.worker_label, "")
        if worker and _admit(worker, reading, limits):
            reading.worker_requests[worker] = reading.worker_requests.get(worker, 0.0) + value


def _typed(name: str, kind: str, types: dict[str, str], reading: _Draft) -> bool:
    found = types.get(name, types.get(name.removesuffix("_total")))
    if found is not None and found not in _EXPECTED_TYPE[kind]:
        reading.count("changed_type")
        return False
    return True


def _decisions(samples: _Samples, schema: RouterSchema, reading: _Draft,
               types: dict[str, str]) -> None:
    for sample, policy_label in schema.decisions:
        if not samples.get(sample) or not _typed(sample, "counter", types, reading):
            continue
        per: dict[str, float] = {}
        for labels_, value in samples.get(sample):
            check_counter(sample, value)
            policy = labels_.get(policy_label, "")
            per[policy] = per.get(policy, 0.0) + value
        for policy, value in per.items():
            reading.decisions[policy] = max(reading.decisions.get(policy, 0.0), value)


def _prediction(samples: _Samples, p: Prediction, reading: _Draft,
                types: dict[str, str]) -> None:
    if p.histogram:
        sums, counts = samples.get(p.sample + "_sum"), samples.get(p.sample + "_count")
        if not counts or not _typed(p.sample, "histogram", types, reading):
            return
        hits = sum(v for _, v in sums)
        total = sum(v for _, v in counts)
        check_counter(p.sample + "_count", total)
        reading.predictions[p.source] = (hits, total)
        return
    rows = samples.get(p.sample)
    if not rows or not _typed(p.sample, "counter", types, reading):
        return
    hits = total = 0.0
    if p.misses_sample:
        hits = sum(v for _, v in rows)
        total = hits + sum(v for _, v in samples.get(p.misses_sample))
    else:
        for labels_, value in rows:
            check_counter(p.sample, value)
            outcome = labels_.get(p.label)
            if outcome in p.hit:
                hits += value
                total += value
            elif outcome in p.miss:
                total += value
            elif outcome not in _OTHER_OUTCOMES:
                reading.count("unknown_value")
    if total > 0 or hits > 0:
        reading.predictions[p.source] = (hits, total)


#: Outcomes of a prediction counter that are no prediction (vllm-router kv_aware's cost-based
#: choice shares the counter of cache_aware's tree matches).
_OTHER_OUTCOMES = frozenset({"prefix_cost", "fallback", "load_balance", "no_prefix"})

__all__ = ["RouterReading", "read_router_page"]
