"""Recording rules and alerts on routers: what each router believed beside what its engines
delivered.

A router (an exporter target of kind ``router``) counts its own predictions: lookups that hit
its index, tree matches, predicted match ratios (``prefixwatch_router_predicted_hits_total``
over ``prefixwatch_router_predictions_total``). The engines it routes to count what they
delivered (``prefixwatch_prefix_cache_hits_total`` over ``..._queries_total``, in tokens).
``prefixwatch_router_worker_target`` joins the two: each engine target belongs to at most one
router (the exporter counts a second claim as ``shared``), so the join is one-to-one. The
believed share is per request or per lookup, the delivered ratio per token: the gap is what a
router believes beyond what it gets, not an identity, and it is large when the index is stale
(dropped or gapped KV events, an engine restarted or reset without replay, a block size, hash
seed or tokenizer that differs from the engines').

Only the exporter has router series (Prometheus reads no router through a vLLM source).
"""

from __future__ import annotations

from typing import Any

from prefixwatch.core.vocab import exposition
from prefixwatch.core.vocab.exposition import L_ROUTER, L_TARGET, L_WORKER
from prefixwatch.core.vocab.families import exposed
from prefixwatch.core.vocab.rulenames import (
    ALERT_ROUTER_FEED,
    ALERT_ROUTER_STALE,
    r_router_believed,
    r_router_delivered,
    r_router_gap,
    r_router_queries,
)
from prefixwatch.mixin.promql import ExporterOnlyRules

PREDICTED = exposed(exposition.OUT_ROUTER_PREDICTED_HITS)
PREDICTIONS = exposed(exposition.OUT_ROUTER_PREDICTIONS)
WORKER_TARGET = exposed(exposition.OUT_ROUTER_WORKER_TARGET)
FEED_PROBLEMS = exposed(exposition.OUT_ROUTER_KV_FEED_PROBLEMS)


class RouterRules(ExporterOnlyRules):
    """The router rules of one source (none but the exporter's) under one config."""

    @property
    def windows(self) -> tuple[str, ...]:
        """The dashboards' window and the alerts' ``router_window``."""
        return self.recorded_windows(self.cfg.router_window)

    def per_router(self, counter: str, w: str) -> str:
        """An engine counter's rate summed over the engines each router routes to."""
        return (f"sum by ({self.labels(L_ROUTER)}) (\n"
                f"  rate({self.sel(counter)}[{self.w(w)}])\n"
                f"  * on ({self.labels(L_TARGET)}) group_left ({L_ROUTER})\n"
                f"  ({self.sel(WORKER_TARGET)} == 1)\n)")

    def recording(self) -> list[dict[str, Any]]:
        if not self.active:
            return []
        s = self.src
        out: list[dict[str, Any]] = []
        on = f"on ({self.labels(L_ROUTER)})"
        for w in self.windows:
            ww = self.w(w)
            out.append({"record": r_router_believed(w), "expr": (
                f"sum by ({self.labels(L_ROUTER)}) (rate({self.sel(PREDICTED)}[{ww}]))\n/\n"
                f"(sum by ({self.labels(L_ROUTER)}) (rate({self.sel(PREDICTIONS)}[{ww}])) > 0)")})
            out.append({"record": r_router_queries(w), "expr": self.per_router(s.queries, w)})
            out.append({"record": r_router_delivered(w), "expr": (
                f"{self.per_router(s.hits, w)}\n/ {on}\n({r_router_queries(w)} > 0)")})
            out.append({"record": r_router_gap(w), "expr": (
                f"{r_router_believed(w)}\n- {on}\n{r_router_delivered(w)}")})
        return out

    def alerts(self, builder: Any) -> list[dict[str, Any]]:
        """``builder`` is the source's ``Alerts`` (one rule's severity, texts, runbook URL)."""
        if not self.active:
            return []
        cfg = self.cfg
        w = cfg.router_window
        router = "{{ $labels.router }}"
        pct = "{{ $value | humanizePercentage }}"
        on = f"on ({self.labels(L_ROUTER)})"
        span = builder.span(w)
        return [
            builder.alert(
                ALERT_ROUTER_STALE,
                f"{r_router_gap(w)} > {cfg.router_gap:g}\n"
                f"and {on} {r_router_queries(w)} > {cfg.min_query_tokens_per_second:g}",
                cfg.router_for, "warning",
                f"Router {router} believes {pct} more prefix hits than its engines deliver.",
                f"Over {span}, router {router} predicted a cache hit for a share of its "
                f"requests {pct} above the prefix-cache hit ratio its engines delivered "
                f"({r_router_believed(w)} beside {r_router_delivered(w)}). Its index of who "
                "holds which prefix is stale: KV events dropped or gapped, an engine "
                "restarted or its cache reset without replay, or a block size, hash seed or "
                "tokenizer that differs from the engines'. Requests chase hits that no longer "
                "exist."),
            builder.alert(
                ALERT_ROUTER_FEED,
                f"sum by ({self.labels(L_ROUTER, L_WORKER)}) "
                f"(increase({self.sel(FEED_PROBLEMS)}[{self.w(w)}])) > 0",
                cfg.router_feed_for, "warning",
                f"Router {router} reports problems with the KV event feed of "
                "{{ $labels.worker }}.",
                f"Over {span}, router {router} counted {{{{ $value }}}} gaps, resyncs or "
                "failures on the KV event feed of worker {{ $labels.worker }}. While the feed "
                "is broken its index is not what the worker holds: cache-aware routing sends "
                "requests by a stale picture."),
        ]
