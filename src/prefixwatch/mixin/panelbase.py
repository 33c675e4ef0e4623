"""What every dashboard panel is built on: the scope's selectors, rates, ratios, quantiles and
the threshold colours, for one source, one config and one scope (all replicas, or one)."""

from __future__ import annotations

from typing import Any

from grafanalib import core as g

from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.grid import Placed
from prefixwatch.mixin.sources import Source

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


class PanelBase:
    """The selectors, PromQL helpers and thresholds every panel uses, for one source, config
    and scope; panels are kept in the order they are added (``layout.flow`` places them)."""

    def __init__(self, s: Source, cfg: MixinConfig, one_replica: bool) -> None:
        self.s = s
        self.cfg = cfg
        self.one = one_replica
        self.placed: list[Placed] = []
        self.thr = cfg.hit_ratio_threshold

    # -- selectors ---------------------------------------------------------------------------

    def matchers(self, *, model: bool = True, replica: str | None = None,
                 raw: bool = True) -> str:
        """``{cluster, job, model, replica, extra matchers}`` as the scope asks; recorded
        series (raw=False) carry only the cluster and the model."""
        parts = []
        if self.cfg.cluster_label:
            parts.append(f'{self.cfg.cluster_label}=~"$cluster"')
        if raw:
            parts.append('job=~"$job"')
        if model:
            parts.append('model_name=~"$model"')
        replica = replica if replica is not None else self.s.replica_label
        if raw and self.one and replica:
            parts.append(f'{replica}=~"$instance"')
        if raw and self.cfg.matchers.strip():
            parts.append(self.cfg.matchers.strip().rstrip(","))
        return "{" + ",".join(parts) + "}"

    def sel(self, metric: str, extra: str = "") -> str:
        scope = self.matchers()
        if extra:
            scope = scope[:-1] + ("," if scope != "{}" else "") + extra + "}"
        return metric + scope

    def recorded(self, name: str, extra: str = "") -> str:
        inner = self.matchers(raw=False)[:-1] + (f",{extra}" if extra else "") + "}"
        return name + inner

    def rate(self, metric: str, extra: str = "") -> str:
        return f"rate({self.sel(metric, extra)}[$__rate_interval])"

    def hits_rate(self) -> str:
        """The device tier's hits per second (SGLang's family counts every tier)."""
        return self.rate(self.s.hits, self.s.hits_matchers)

    def ratio(self, by: str) -> str:
        hits = f"sum by ({by}) ({self.hits_rate()})"
        queries = f"sum by ({by}) ({self.rate(self.s.queries)})"
        return f"{hits}\n/\n({queries} > 0)"

    def quantile(self, q: str, bucket: str, by: str = "model_name") -> str:
        return f"histogram_quantile({q}, sum by ({by}, le) ({self.rate(bucket)}))"

    @staticmethod
    def target(expr: str, legend: str, ref: str) -> g.Target:
        return g.Target(expr=expr, legendFormat=legend, refId=ref, datasource=DATASOURCE)

    def add(self, panel: Any, w: int, h: int) -> None:
        panel.dataSource = DATASOURCE
        self.placed.append(Placed(panel, w, h))

    @staticmethod
    def right_axis(match: str, unit: str, *props: tuple[str, Any], by: str = "byRegexp"
                   ) -> list[dict[str, Any]]:
        """The override that draws the series ``match`` names on a right axis in ``unit``."""
        return [{"matcher": {"id": by, "options": match},
                 "properties": [{"id": "custom.axisPlacement", "value": "right"},
                                {"id": "unit", "value": unit},
                                *({"id": k, "value": v} for k, v in props)]}]

    def hit_thresholds(self) -> list[g.Threshold]:
        return [g.Threshold("red", 0, 0.0), g.Threshold("green", 1, self.thr)]

    def threshold_note(self) -> str:
        own = sorted(m for m, o in self.cfg.models.items()
                     if o.threshold is not None or o.disabled)
        return f" (the default; {', '.join(own)} have their own)" if own else ""

    # -- panels ------------------------------------------------------------------------------
