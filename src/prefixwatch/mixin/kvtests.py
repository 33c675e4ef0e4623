"""Generated promtool cases for the KV event rules (the exporter's source only).

Written in terms of traffic, like the other cases: prompt tokens per second per replica, and
the shares of them the exporter counted as computed by part. Each alert fires, is pending, and
stays quiet below the threshold; the recorded shares sum to 1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefixwatch.core.vocab.exposition import (
    KV_WHATIF_POOL_SCALES,
    L_PART,
    L_POOL_SCALE,
    LEDGER_TAIL,
)
from prefixwatch.core.vocab.rulenames import (
    ALERT_KV_EVICTION,
    ALERT_KV_ROUTING,
    MODEL_PART,
    POOL_SCALE_TODAY,
    r_kv_computed_share,
    r_kv_whatif_ratio,
)
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.mixin.kvrules import KV_COMPUTED, KV_WHATIF
from prefixwatch.mixin.promql import DASHBOARD_WINDOW, ExporterOnlyRules

STEP = 15  # as alerttests: seconds between samples
MODEL = "llama-3-8b"  # as alerttests


def kv_series(cases: Any, target: str, shares: dict[str, float], tokens_per_s: float,
              minutes: float, start: float = 0.0) -> list[dict[str, str]]:
    """The exporter's computed-token counters of one replica: flat (0) for ``start`` minutes,
    then ``shares`` of ``tokens_per_s`` prompt tokens per part."""
    idle = round(start * 60 / STEP)
    n = round((minutes - start) * 60 / STEP)
    out = []
    for part, share in sorted(shares.items()):
        per_step = share * tokens_per_s * STEP
        values = f"0+0x{idle} 0+{per_step:g}x{n}" if idle else f"0+{per_step:g}x{n}"
        out.append({"series": cases.series_name(KV_COMPUTED, {
            **cases.base_labels(target), L_PART: part}), "values": values})
    return out


def kv_cases(cases: Any, case: Callable[..., None], phase: Callable[..., Any]) -> None:
    """``cases`` is the source's ``alerttests.Cases``; ``case`` adds one test; ``phase`` makes
    an ``alerttests.Phase``. Only the exporter has KV event series."""
    if cases.source != "exporter":
        return
    cfg = cases.cfg
    busy = max(1000, round(10 * cfg.min_query_tokens_per_second))
    share = cfg.diagnosis.thresholds.routing_gap
    window = parse_duration(cfg.kv_window) / 60
    for_ = parse_duration(cfg.kv_for) / 60
    m = {"model_name": MODEL}
    above = round(min(share + 0.1, 0.95), 6)
    below = round(share / 2, 6)
    # 20. A replica recomputes what it evicted: from 20m on, `above` of its prompt tokens are
    #     the eviction part (the tails 2%, novel the rest of the misses). The window's share
    #     passes the threshold within the window, then `for`: quiet before, firing after; the
    #     tail is one of the recorded shares (of the computed tokens: 0.02 / 0.9).
    start = 20.0
    minutes = start + window + for_ + 15
    tail = 0.02
    evicting = {"eviction": above, "novel": round(0.9 - above - tail, 6), LEDGER_TAIL: tail}
    labels = {**m, "target": "vllm-0:8000", L_PART: "eviction"}
    shares = r_kv_computed_share(MODEL_PART, DASHBOARD_WINDOW)
    sample = ",".join(f'{k}="{v}"' for k, v in sorted({**cases.extra, **m}.items()))
    case(cases.traffic([phase(minutes, busy, 0.1)]) +
         kv_series(cases, "vllm-0:8000", evicting, busy, minutes, start), [
        cases.at(ALERT_KV_EVICTION, start + for_, []),
        cases.at(ALERT_KV_EVICTION, minutes - 1,
                 [cases.expect(ALERT_KV_EVICTION, "warning", labels, above)]),
        cases.at(ALERT_KV_ROUTING, minutes - 1, [])],
        [{"expr": f"round(sum by (model_name) ({shares}), 0.000001)",
          "eval_time": f"{round(minutes - 1)}m",
          "exp_samples": [{"labels": "{" + sample + "}", "value": 1}]},
         {"expr": f'round({shares}{{{L_PART}="{LEDGER_TAIL}"}}, 0.000001)',
          "eval_time": f"{round(minutes - 1)}m",
          "exp_samples": [{"labels": f'{{{sample},{L_PART}="{LEDGER_TAIL}"}}',
                           "value": round(tail / 0.9, 6)}]}])
    #     Below the threshold it stays quiet.
    case(cases.traffic([phase(minutes, busy, 0.1)]) +
         kv_series(cases, "vllm-0:8000", {"eviction": below, "novel": 0.9 - below}, busy,
                   minutes), [cases.at(ALERT_KV_EVICTION, minutes - 1, [])])
    # 21. Two replicas, round-robin: half of replica 1's prompt tokens were cached on replica
    #     0 (the routing part), a quarter of the model's: PrefixCacheRoutingWaste when that
    #     reaches the threshold, per model (no target label).
    routed = round(min(2 * (share + 0.05), 1.0), 6)
    minutes = window + for_ + 10
    series = (cases.traffic([phase(minutes, busy, 0.8)], target="vllm-0:8000") +
              cases.traffic([phase(minutes, busy, round(0.8 - routed, 6) if routed < 0.8
                                   else 0.0)], target="vllm-1:8000") +
              kv_series(cases, "vllm-0:8000", {"novel": 0.2}, busy, minutes) +
              kv_series(cases, "vllm-1:8000", {"routing": routed, "novel": 0.2}, busy,
                        minutes))
    case(series, [
        cases.at(ALERT_KV_ROUTING, for_ / 2, []),
        cases.at(ALERT_KV_ROUTING, minutes - 1,
                 [cases.expect(ALERT_KV_ROUTING, "warning", {**m, L_PART: "routing"},
                               routed / 2)]),
        cases.at(ALERT_KV_EVICTION, minutes - 1, [])])
    whatif_cases(cases, case, phase, busy)


#: The pool what-if case's curve: the hit ratio at each pool_scale (today's 0.5 at "1").
CURVE: dict[str, float] = {POOL_SCALE_TODAY: 0.5, **dict(zip(KV_WHATIF_POOL_SCALES,
                                                            (0.62, 0.71, 0.8, 0.86),
                                                            strict=True))}


def whatif_cases(cases: Any, case: Callable[..., None], phase: Callable[..., Any],
                 busy: int) -> None:
    """22. The pool what-if curve per model: replica 0 follows its KV stream (the exporter's
    what-if counters), replica 1 does not and serves nothing from cache. The curve is replica
    0's alone: its delivered ratio at pool_scale "1" (every tier), each larger pool's
    what-if; replica 1's prompt tokens are in neither side."""
    minutes = 20
    n = round(minutes * 60 / STEP)
    series = (cases.traffic([phase(minutes, busy, CURVE[POOL_SCALE_TODAY])],
                            target="vllm-0:8000") +
              cases.traffic([phase(minutes, busy, 0.0)], target="vllm-1:8000"))
    for scale in KV_WHATIF_POOL_SCALES:
        series.append({"series": cases.series_name(KV_WHATIF, {
            **cases.base_labels("vllm-0:8000"), L_POOL_SCALE: scale}),
            "values": f"0+{CURVE[scale] * busy * STEP:g}x{n}"})
    labels = {**cases.extra, "model_name": MODEL}
    samples = [{"labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(
                   {**labels, L_POOL_SCALE: scale}.items())) + "}", "value": CURVE[scale]}
               for scale in sorted(CURVE)]
    exprs = [{"expr": f"round({r_kv_whatif_ratio(w)}, 0.000001)",
              "eval_time": f"{minutes - 1}m", "exp_samples": samples}
             for w in ExporterOnlyRules.recorded_windows(cases.cfg.kv_window)]
    case(series, [], exprs)
