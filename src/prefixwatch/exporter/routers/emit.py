"""The ``prefixwatch_router_*`` series: each router's own counts, and its workers' targets.

The router's counters are written as the router exports them (counter semantics kept: a router
restart is a reset Prometheus handles); the believed share, the delivered ratio of its engines
and the gap between them are the mixin's recording rules over these series and the engines'
(mixin/routerrules.py). A router that is down writes only its error counters (its
``prefixwatch_target_up`` says it is down), like an engine target.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from prometheus_client.core import Metric

from prefixwatch.core.vocab import exposition
from prefixwatch.core.vocab.exposition import OutMetric
from prefixwatch.exporter.config import redact_url
from prefixwatch.exporter.routers.match import RouterView, match_workers

log = logging.getLogger("prefixwatch.exporter")
#: (router, worker, reason) already logged: an unmatched worker is said once, not per scrape.
_SAID: set[tuple[str, str, str]] = set()
_SAID_LOCK = threading.Lock()
_SAID_MAX = 4096


def _say_unmatched(router: str, unmatched: dict[str, str]) -> None:
    for worker, reason in unmatched.items():
        key = (router, worker, reason)
        with _SAID_LOCK:
            if key in _SAID or len(_SAID) >= _SAID_MAX:
                continue
            _SAID.add(key)
        why = ("no target serves it (give the router a workers: map, or add the engine as a "
               "target)" if reason == exposition.ROUTER_UNMATCHED_NO_TARGET else
               "an earlier router in the config claims its target")
        log.warning("router %s: worker %s matched to no engine target: %s", router,
                    redact_url(worker), why)


def router_views(views: Iterable) -> list[RouterView]:
    """Every router target's last page with its workers matched to the engine targets, from
    the targets' published views (TargetView: no lock taken)."""
    found = []
    engines = []
    for view in views:
        if view.router is not None:
            found.append(view)
        elif view.target.kind != exposition.TARGET_KIND_ROUTER:
            engines.append((view.name, view.target.url))
    matches = match_workers(((v.name, list(v.router.workers), dict(v.target.workers))
                             for v in found), engines)
    for name, (_matched, unmatched) in matches.items():
        _say_unmatched(name, unmatched)
    return [RouterView(v.name, v.router.kind, v.up, v.router, v.router_errors, *matches[v.name])
            for v in found]


def add_router_families(family: Callable[[OutMetric], Metric],
                        views: Iterable[RouterView]) -> None:
    """Write each router's series into the collector's families."""
    for view in views:
        r = view.name
        errors = family(exposition.OUT_ROUTER_ERRORS)
        for reason in exposition.ROUTER_ERROR_REASONS:
            errors.add_metric([r, reason], float(view.errors.get(reason, 0)))
        if not view.up:
            continue
        reading = view.reading
        family(exposition.OUT_ROUTER_INFO).add_metric([r], {exposition.L_KIND: view.kind})
        for worker, value in sorted(reading.worker_requests.items()):
            family(exposition.OUT_ROUTER_WORKER_REQUESTS).add_metric([r, redact_url(worker)], value)
        for worker, target in sorted(view.matched.items()):
            family(exposition.OUT_ROUTER_WORKER_TARGET).add_metric([r, redact_url(worker), target],
                                                              1.0)
        unmatched = family(exposition.OUT_ROUTER_UNMATCHED_WORKERS)
        for reason in exposition.ROUTER_UNMATCHED_REASONS:
            unmatched.add_metric([r, reason], float(sum(
                1 for why in view.unmatched.values() if why == reason)))
        for policy, value in sorted(reading.decisions.items()):
            family(exposition.OUT_ROUTER_DECISIONS).add_metric([r, policy], value)
        for source, (hits, total) in sorted(reading.predictions.items()):
            family(exposition.OUT_ROUTER_PREDICTED_HITS).add_metric([r, source], hits)
            family(exposition.OUT_ROUTER_PREDICTIONS).add_metric([r, source], total)
        for (worker, problem), value in sorted(reading.feed.items()):
            family(exposition.OUT_ROUTER_KV_FEED_PROBLEMS).add_metric(
                [r, redact_url(worker), problem], value)
