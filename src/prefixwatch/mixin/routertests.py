"""Generated promtool cases for the router rules (the exporter's source only), at literal times.

One router in front of one replica. It predicts a hit for 95% of its requests throughout; the
replica delivers 90% until minute 20, then 10% (its cache was reset and the router's index
kept the blocks, or its KV feed stopped): the gap opens at 20m, passes ``router_gap`` within
the window and fires after ``router_for``, not before. The router's KV feed reports a gap
from minute 20: the feed alert fires after ``router_feed_for``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prefixwatch.core.vocab.exposition import L_ROUTER, L_SOURCE, L_TARGET, L_WORKER
from prefixwatch.core.vocab.rulenames import (
    ALERT_ROUTER_FEED,
    ALERT_ROUTER_STALE,
    r_router_believed,
    r_router_delivered,
)
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.mixin.promql import DASHBOARD_WINDOW
from prefixwatch.mixin.promtoolinput import sample
from prefixwatch.mixin.routerrules import (
    FEED_PROBLEMS,
    PREDICTED,
    PREDICTIONS,
    WORKER_TARGET,
)
from prefixwatch.mixin.sources import EXPORTER_JOB

STEP = 15  # as alerttests: seconds between samples
ROUTER = "router-0"
WORKER = "http://vllm-0:8000"
TARGET = "vllm-0:8000"
SOURCE = "vllm_router_kv_placement_lookups_total"


def _steady(per_step: float, minutes: float, start_minutes: float = 0.0) -> str:
    idle = round(start_minutes * 60 / STEP)
    n = round((minutes - start_minutes) * 60 / STEP)
    return f"0+0x{idle} 0+{per_step:g}x{n}" if idle else f"0+{per_step:g}x{n}"


def router_cases(cases: Any, case: Callable[..., None], phase: Callable[..., Any]) -> None:
    """``cases`` is the source's ``alerttests.Cases``; ``case`` adds one test; ``phase`` makes
    an ``alerttests.Phase``."""
    if cases.source != "exporter":
        return
    cfg = cases.cfg
    busy = max(1000, round(10 * cfg.min_query_tokens_per_second))
    window = parse_duration(cfg.router_window) / 60
    for_ = parse_duration(cfg.router_for) / 60
    feed_for = parse_duration(cfg.router_feed_for) / 60
    start = 20.0
    minutes = start + window + for_ + 10
    base = {**EXPORTER_JOB, L_ROUTER: ROUTER, **cases.extra}
    requests = 30  # per step
    router = [
        {"series": cases.series_name(WORKER_TARGET, {**base, L_WORKER: WORKER,
                                                      L_TARGET: TARGET}),
         "values": f"1+0x{round(minutes * 60 / STEP)}"},
        {"series": cases.series_name(PREDICTED, {**base, L_SOURCE: SOURCE}),
         "values": _steady(0.95 * requests, minutes)},
        {"series": cases.series_name(PREDICTIONS, {**base, L_SOURCE: SOURCE}),
         "values": _steady(requests, minutes)},
        {"series": cases.series_name(FEED_PROBLEMS, {**base, L_WORKER: WORKER,
                                                      "problem": "gap"}),
         "values": _steady(1, minutes, start)},
    ]
    traffic = cases.traffic([phase(start, busy, 0.9), phase(minutes - start, busy, 0.1)],
                            target=TARGET)
    labels = {L_ROUTER: ROUTER, **cases.extra}
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    w5 = DASHBOARD_WINDOW
    # 22. Believed 95% throughout; delivered 90% then 10%: quiet while both agree and for
    #     less than `for` after the gap opens, firing by the end with the gap (85%).
    case(traffic + router, [
        cases.at(ALERT_ROUTER_STALE, start - 1, []),
        cases.at(ALERT_ROUTER_STALE, start + for_ / 2, []),
        cases.at(ALERT_ROUTER_STALE, minutes - 1,
                 [cases.expect(ALERT_ROUTER_STALE, "warning", labels, 0.85)]),
        cases.at(ALERT_ROUTER_FEED, start + feed_for / 2, []),
        cases.at(ALERT_ROUTER_FEED, minutes - 1, [cases.expect(
            ALERT_ROUTER_FEED, "warning", {**labels, L_WORKER: WORKER},
            parse_duration(cfg.router_window) / STEP)]),
    ], [sample(f"round({r_router_believed(w5)}, 0.000001)", f"{round(start - 1)}m",
               f"{{{inner}}}", 0.95),
        sample(f"round({r_router_delivered(w5)}, 0.000001)", f"{round(start - 1)}m",
               f"{{{inner}}}", 0.9),
        sample(f"round({r_router_delivered(w5)}, 0.000001)", f"{round(minutes - 1)}m",
               f"{{{inner}}}", 0.1)])
    # 23. A router that believes what its engines deliver stays quiet.
    agree = cases.traffic([phase(minutes, busy, 0.95)], target=TARGET)
    case(agree + router[:3], [cases.at(ALERT_ROUTER_STALE, minutes - 1, [])])
