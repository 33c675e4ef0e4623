"""The promtool cases of a second cache tier: part of alerttests.Cases (they read its series
helpers and config)."""

from __future__ import annotations

from typing import Any

from prefixwatch.core.vocab.rulenames import (
    ALERT_DEVICE_SHARE,
    ALERT_LOW,
    ALERT_OFFLOAD_FAILURES,
    ALERT_REGRESSION,
    ALERT_TIER_IDLE,
    MODEL_TIER,
    r_cached,
    r_effective,
    r_offload_failed,
)
from prefixwatch.core.vocab.tiers import TIER_HOST
from prefixwatch.mixin.pagetiming import page_times
from prefixwatch.mixin.promtoolinput import MODEL, STEP, Phase, sample


class TierCases:
    def tier_cases(self, case: Any) -> None:
        """A second tier: it rescues the fleet (no page on the effective ratio), both tiers
        collapse (a page as fast as a device collapse), it serves nothing (TierIdle), HBM is
        outgrown (DeviceShareLow), offload stores are lost (OffloadFailures)."""
        cfg, m = self.cfg, {"model_name": MODEL}
        thr = cfg.hit_ratio_threshold
        busy = max(1000, round(10 * cfg.min_query_tokens_per_second))
        effective = self.builder.effective
        low = ALERT_LOW
        # 15. The host tier keeps the effective ratio above the threshold while the device
        #     pool's is far below (42% device + 46% host = 88%, as in offload-rescue): no
        #     page on the effective ratio; on the device ratio, the page it asks for.
        device_part = round(min(0.42, thr - 0.2), 6)
        host_part = round(min(0.88, thr + 0.18) - device_part, 6)
        rescued = [Phase(20, busy, device_part, host=host_part)]
        case(self.traffic(rescued), [
            self.at(low, 10, [] if effective else [
                self.expect(low, "critical", m, device_part)]),
            self.at(ALERT_TIER_IDLE, 19, []),
        ], [sample(f'round({r_effective("model_name", "5m")}, 0.0001)', "15m",
                   f'{{model_name="{MODEL}"}}', round(device_part + host_part, 4)),
            sample(f'round({r_cached(MODEL_TIER, "5m")}{{tier="{TIER_HOST}"}}, 0.001)',
                   "15m", f'{{model_name="{MODEL}",tier="{TIER_HOST}"}}',
                   round(busy * host_part, 3))])
        # 16. Both tiers collapse at 60m (42% + 46% -> 2% + 1%): critical as fast as a device
        #     collapse (within 75 s of its first sample).
        both = [Phase(60, busy, device_part, host=host_part), Phase(20, busy, 0.02, host=0.01)]
        if effective:
            times = page_times(cfg, both)
            case(self.traffic(both), [
                self.at(low, 60, []),
                self.at(low, times.earliest - STEP / 60, []),
                self.at(low, times.latest, [self.expect(low, "critical", m, times.value)])])
        # 17. A host tier that stores (connector lookups, HiCache backups) and serves nothing
        #     while the device pool misses 60%: TierIdle after 15m of data and 30m of `for`.
        idle = [Phase(60, busy, 0.4, host=0.0)]
        case(self.traffic(idle), [
            self.at(ALERT_TIER_IDLE, 30, []),
            self.at(ALERT_TIER_IDLE, 50, [self.expect(ALERT_TIER_IDLE, "warning", m, 0.0)])])
        # 18. HBM outgrown: 85% device + 5% host for 3h, then 45% + 45%: the effective ratio
        #     holds at 90%, the device share fell 40 points: DeviceShareLow, no hit-rate alert.
        outgrown = [Phase(180, busy, 0.85, host=0.05), Phase(60, busy, 0.45, host=0.45)]
        case(self.traffic(outgrown), [
            self.at(ALERT_DEVICE_SHARE, 180, []),
            self.at(ALERT_DEVICE_SHARE, 230, [self.expect(ALERT_DEVICE_SHARE, "warning", m,
                                                          0.45)]),
            *([self.at(low, 230, []), self.at(ALERT_REGRESSION, 230, [])] if effective
              else [])])
        #     ...but a fleet without a second tier whose ratio falls gets Regression, not this.
        # 19. The offload connector drops 30% of its stores (host pool full): OffloadFailures.
        t = self.src.tiers
        if t is not None and t.offload_outcomes:
            labels = self.base_labels("vllm-0:8000")
            outcomes = [{"series": self.series_name(t.offload_outcomes,
                                                    {**labels, t.offload_label: outcome}),
                         "values": f"0+{per_step}x240"}
                        for outcome, per_step in ((t.offload_stored, 70),
                                                  (t.offload_failed[0].split("|")[0], 30))]
            case(self.traffic([Phase(60, busy, 0.5, host=0.3)]) + outcomes, [
                self.at(ALERT_OFFLOAD_FAILURES, 10, []),
                self.at(ALERT_OFFLOAD_FAILURES, 40, [self.expect(
                    ALERT_OFFLOAD_FAILURES, "warning", {**m, "target": "vllm-0:8000"}, 0.3)])],
                [sample(failed := r_offload_failed(self.cfg.warning_window), "30m",
                        f'{failed}{{model_name="{MODEL}",target="vllm-0:8000"}}', 0.3)])
