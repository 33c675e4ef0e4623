"""Recording rules: hit ratios per model and per replica, baselines, TTFT, pressure, capacity.

Recorded series have the same names whatever the source, so alerts and dashboards are written
once. Per-replica series carry a ``target`` label: the exporter's own, or a copy of
``instance`` when Prometheus scrapes the engines directly. Hit ratios are always
``sum(rate(hits)) / sum(rate(queries))`` (never an average of ratios) and absent, not NaN,
without traffic. With a cluster label, every aggregation keeps it.
"""

from __future__ import annotations

from typing import Any

from prefixwatch.core import names
from prefixwatch.core.rulenames import (
    MODEL,
    MODEL_TARGET,
    R_ACHIEVABLE,
    R_BASELINE,
    R_KV,
    R_MISSED,
    R_PREEMPT,
    R_PROMPT_LEN,
    R_RESETS,
    R_SAVED_SHARE,
    R_TTFT,
    R_TTFT_TARGET,
    R_WAITING,
    TARGET_WINDOWS,
    r_hits,
    r_queries,
    r_ratio,
)
from prefixwatch.mixin.promql import Exprs


class Recording(Exprs):
    def by_target(self, expr: str, *extra: str, op: str = "sum") -> str:
        """Aggregate by model and replica, naming the replica `target` whatever the source."""
        if self.src.replica_label != "target":
            expr = f'label_replace({expr}, "target", "$1", "{self.src.replica_label}", "(.*)")'
        return f"{op} by ({self.labels(MODEL, 'target', *extra)}) ({expr})"

    def by_model(self, expr: str, *extra: str, op: str = "sum") -> str:
        return f"{op} by ({self.labels(MODEL, *extra)}) ({expr})"

    def recording(self) -> list[dict[str, Any]]:
        s, rules = self.src, []
        on_model = f"on ({self.labels(MODEL)})"

        def rec(name: str, expr: str) -> None:
            rules.append({"record": name, "expr": expr})

        for w in self.cfg.windows:
            rec(r_queries(MODEL, w), self.by_model(f"rate({self.sel(s.queries)}[{self.w(w)}])"))
            rec(r_hits(MODEL, w), self.by_model(f"rate({self.sel(s.hits)}[{self.w(w)}])"))
            rec(r_ratio(MODEL, w), f"{r_hits(MODEL, w)} / ({r_queries(MODEL, w)} > 0)")
        for w in TARGET_WINDOWS:
            rec(r_queries(MODEL_TARGET, w),
                self.by_target(f"rate({self.sel(s.queries)}[{self.w(w)}])"))
            rec(r_hits(MODEL_TARGET, w), self.by_target(f"rate({self.sel(s.hits)}[{self.w(w)}])"))
            rec(r_ratio(MODEL_TARGET, w),
                f"{r_hits(MODEL_TARGET, w)} / ({r_queries(MODEL_TARGET, w)} > 0)")
        base, offset = self.w("2h"), self.w("1h")
        rec(R_BASELINE,
            self.by_model(f"rate({self.sel(s.hits)}[{base}] offset {offset})") + "\n/\n(" +
            self.by_model(f"rate({self.sel(s.queries)}[{base}] offset {offset})") + " > 0)")
        cold = self.w(self.cfg.cold_start)
        rec(R_RESETS, self.by_model(f"resets({self.sel(s.queries)}[{cold}])", op="max"))
        for name, bucket, quantiles, per_target in (
                (R_TTFT, s.ttft_bucket, ("0.5", "0.95", "0.99"), False),
                (R_TTFT_TARGET, s.ttft_bucket, ("0.5", "0.95"), True),
                (R_PROMPT_LEN, s.prompt_len_bucket, ("0.5", "0.99"), False)):
            if bucket is None:
                continue
            rate = f"rate({self.sel(bucket)}[{self.w('5m')}])"
            agg = self.by_target(rate, "le") if per_target else self.by_model(rate, "le")
            parts = [f'label_replace(histogram_quantile({q}, {agg}), "quantile", "{q}", "", "")'
                     for q in quantiles]
            rec(name, "\nor\n".join(parts))
        if s.kv_usage:
            gauge = f"max_over_time({self.sel(s.kv_usage)}[{self.w('5m')}])"
            rec(R_KV, self.by_target(gauge, op="max"))
        if s.preemptions:
            rec(R_PREEMPT, self.by_target(f"rate({self.sel(s.preemptions)}[{self.w('5m')}])"))
        if s.waiting:
            gauge = f"max_over_time({self.sel(s.waiting)}[{self.w('5m')}])"
            rec(R_WAITING, self.by_target(gauge))
        # Capacity and cost: the share of prefill work the caches saved, and the prefill
        # tokens per second recomputed that an unlimited cache could have served (the
        # exporter's achievable ratio, from a requests log, minus the achieved one).
        if s.prompt_tokens and s.prompt_tokens_cached:
            w5 = self.w("5m")
            rec(R_SAVED_SHARE,
                self.by_model(f"rate({self.sel(s.prompt_tokens_cached)}[{w5}])") + "\n/\n(" +
                self.by_model(f"rate({self.sel(s.prompt_tokens)}[{w5}])") + " > 0)")
        # The exporter's series, whatever the source (no source selector: its own job).
        rec(R_ACHIEVABLE, self.by_model(names.OUT_ACHIEVABLE.name, op="max"))
        rec(R_MISSED,
            f"clamp_min({R_ACHIEVABLE} - {on_model} {r_ratio(MODEL, '5m')}, 0)\n"
            f"* {on_model} {r_queries(MODEL, '5m')}")
        return rules
