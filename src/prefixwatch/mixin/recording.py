"""Recording rules: hit ratios per model and per replica, baselines, TTFT, pressure, capacity.

Recorded series have the same names whatever the source, so alerts and dashboards are written
once. Per-replica series carry a ``target`` label: the exporter's own, or a copy of
``instance`` when Prometheus scrapes the engines directly. Hit ratios are always
``sum(rate(hits)) / sum(rate(queries))`` (never an average of ratios) and absent, not NaN,
without traffic. With a cluster label, every aggregation keeps it.
"""

from __future__ import annotations

from typing import Any

from prefixwatch.core.vocab import exposition
from prefixwatch.core.vocab.rulenames import (
    MODEL,
    MODEL_TARGET,
    MODEL_TARGET_TIER,
    MODEL_TIER,
    R_ACHIEVABLE,
    R_KV,
    R_LEDGER_SHARE,
    R_LEDGER_TOKENS,
    R_MISSED,
    R_PREEMPT,
    R_PROMPT_LEN,
    R_RESETS,
    R_SAVED_SHARE,
    R_TTFT,
    R_TTFT_TARGET,
    R_WAITING,
    REPLICA_WINDOW,
    r_cached,
    r_effective,
    r_hits,
    r_lower_tier,
    r_offload_failed,
    r_prompt,
    r_queries,
    r_ratio,
    r_recomputed,
    r_tier_active,
)
from prefixwatch.core.vocab.tiers import TIER_DEVICE
from prefixwatch.mixin.kvrules import KVRules
from prefixwatch.mixin.promql import Exprs, tier_rates


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

        for level, windows, agg in ((MODEL, self.cfg.recorded_windows, self.by_model),
                                    (MODEL_TARGET, self.cfg.target_windows, self.by_target)):
            for w in windows:
                rec(r_queries(level, w), agg(f"rate({self.sel(s.queries)}[{self.w(w)}])"))
                rec(r_hits(level, w), agg(f"rate({self.hits_sel()}[{self.w(w)}])"))
                rec(r_ratio(level, w), f"{r_hits(level, w)} / ({r_queries(level, w)} > 0)")
        base, offset = self.w(self.cfg.baseline_window), self.w(self.cfg.baseline_offset)
        rec(self.cfg.baseline(),
            self.by_model(f"rate({self.hits_sel()}[{base}] offset {offset})") + "\n/\n(" +
            self.by_model(f"rate({self.sel(s.queries)}[{base}] offset {offset})") + " > 0)")
        rules.extend(self.tier_rules())
        cold = self.w(self.cfg.cold_start)
        rec(R_RESETS, self.by_model(f"resets({self.sel(s.queries)}[{cold}])", op="max"))
        for name, bucket, quantiles, per_target in (
                (R_TTFT, s.ttft, ("0.5", "0.95", "0.99"), False),
                (R_TTFT_TARGET, s.ttft, ("0.5", "0.95"), True),
                (R_PROMPT_LEN, s.prompt_len, ("0.5", "0.99"), False)):
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
        rec(R_ACHIEVABLE, self.by_model(exposition.OUT_ACHIEVABLE.name, op="max"))
        rec(R_MISSED,
            f"clamp_min({R_ACHIEVABLE} - {on_model} {r_ratio(MODEL, '5m')}, 0)\n"
            f"* {on_model} {r_queries(MODEL, '5m')}")
        rules.extend(self.ledger_rules())
        rules.extend(KVRules(self.src.name, self.cfg).recording())
        return rules

    def ledger_rules(self) -> list[dict[str, Any]]:
        """The hit-rate ledger's parts per model (the exporter's, from a request log or the KV
        event streams): its counted parts, the engines' cached tokens of every tier as
        ``achieved``, the event ledger's ``tail`` (the tokens no full block covers; absent for
        a request log) and ``unexplained = pool_reach - achieved - tail``, so the shares sum
        to 1. Only the exporter has a ledger; absent without a request log or a stream."""
        if self.src.name != "exporter":
            return []
        tokens, w5 = f"{exposition.OUT_LEDGER_TOKENS.name}_total", self.w("5m")
        on = f"on ({self.labels(MODEL)})"

        def part(matcher: str, *extra: str) -> str:
            sel = self.sel(tokens, f'{exposition.L_PART}{matcher}')
            return self.by_model(f"rate({sel}[{w5}])", *extra)

        achieved = r_cached(MODEL, "5m") if self.src.tiers else r_hits(MODEL, "5m")
        prompt, pool = part('="prompt"'), part('="pool_reach"')
        missed = "|".join([p for p in exposition.LEDGER_SHARES if p in exposition.LEDGER_COUNTED]
                          + [exposition.LEDGER_TAIL])
        tail_matcher = f'="{exposition.LEDGER_TAIL}"'
        tail = f"({part(tail_matcher)} or 0 * {pool})"
        by_part = "\nor\n".join((
            part(f'=~"{missed}"', exposition.L_PART),
            f'label_replace({achieved} and {on} {prompt}, "{exposition.L_PART}", "achieved", '
            '"", "")',
            f'label_replace({pool} - {on} {achieved} - {on} {tail}, "{exposition.L_PART}", '
            '"unexplained", "", "")'))
        return [{"record": R_LEDGER_TOKENS, "expr": by_part},
                {"record": R_LEDGER_SHARE,
                 "expr": f"{R_LEDGER_TOKENS}\n/ {on} group_left ()\n({prompt} > 0)"}]

    def tier_rates(self, window: str, per_target: bool) -> str:
        """Cached prompt tokens per second by tier over ``window`` (e.g. '[5m] offset 1h')."""
        t = self.src.tiers
        assert t is not None
        extra = ("target",) if per_target else ()

        def by(expr: str) -> str:
            return (self.by_target(expr, "tier") if per_target
                    else self.by_model(expr, "tier"))

        return tier_rates(t, lambda m, x: f"rate({self.sel(m, x)}{window})", by,
                          self.labels(MODEL, *extra))

    def tier_rules(self) -> list[dict[str, Any]]:
        """Tokens by tier, the effective ratio, what no tier served and what a second tier
        does: the hit-rate alerts judge the effective ratio (MixinConfig.hit_ratio)."""
        t, out = self.src.tiers, []
        if t is None:
            return out

        def rec(name: str, expr: str) -> None:
            out.append({"record": name, "expr": expr})

        levels = [(MODEL, MODEL_TIER, w, False) for w in self.cfg.recorded_windows]
        levels += [(MODEL_TARGET, MODEL_TARGET_TIER, w, True) for w in self.cfg.target_windows]
        for level, tier_level, w, per_target in levels:
            group = self.labels(MODEL, *(("target",) if per_target else ()))
            on = f"on ({group})"
            agg = self.by_target if per_target else self.by_model
            rec(r_cached(tier_level, w), self.tier_rates(f"[{self.w(w)}]", per_target))
            rec(r_cached(level, w), f"sum by ({group}) ({r_cached(tier_level, w)})")
            rec(r_prompt(level, w), agg(f"rate({self.sel(t.total)}[{self.w(w)}])"))
            rec(r_effective(level, w), f"{r_cached(level, w)} / ({r_prompt(level, w)} > 0)")
            rec(r_recomputed(level, w),
                f"clamp_min({r_prompt(level, w)} - {on} {r_cached(level, w)}, 0)")
            if not per_target and w in (REPLICA_WINDOW, self.cfg.warning_window):
                device = f'{r_cached(tier_level, w)}{{tier="{TIER_DEVICE}"}}'
                rec(r_lower_tier(level, w),
                    f"({r_cached(level, w)} - {on} {device})\n/ {on}\n"
                    f"(({r_prompt(level, w)} - {on} {device}) > 0)")
        base, offset = self.w(self.cfg.baseline_window), self.w(self.cfg.baseline_offset)
        cached = self.by_model(self.tier_rates(f"[{base}] offset {offset}", False))
        rec(self.cfg.baseline(effective=True), cached + "\n/\n(" + self.by_model(
            f"rate({self.sel(t.total)}[{base}] offset {offset})") + " > 0)")
        warning, w15 = self.cfg.warning_window, self.w(self.cfg.warning_window)
        signals = [f"{self.by_model(f'rate({self.sel(m, x)}[{w15}])')} > 0"
                   for m, x in t.active_counters]
        signals += [f"{self.by_model(f'max_over_time({self.sel(g)}[{w15}])', op='max')} > 0"
                    for g in t.active_gauges]
        if signals:
            rec(r_tier_active(warning),
                f"count by ({self.labels(MODEL)}) (\n" + "\nor\n".join(signals) + "\n)")
        if t.offload_outcomes:
            failed = f'{t.offload_label}=~"{"|".join(t.offload_failed)}"'
            tried = f'{t.offload_label}=~"{"|".join((t.offload_stored, *t.offload_failed))}"'
            rec(r_offload_failed(warning),
                self.by_target(f"rate({self.sel(t.offload_outcomes, failed)}[{w15}])")
                + "\n/\n(" +
                self.by_target(f"rate({self.sel(t.offload_outcomes, tried)}[{w15}])") + " > 0)")
        return out
