"""promtool tests for a multi-cluster config: two clusters, one global rule evaluation.

With ``cluster_label`` set, the rules run where every cluster's series meet (Thanos Ruler,
Mimir, a federating Prometheus). These cases hold them to it: the same model and replica
names in two clusters, one cluster collapsing, one vanishing; each alert fires for its own
cluster with the cluster label, the diagnosis it names is its own cluster's, and the fleet
ratio is summed before dividing within each cluster (never across them).
"""

from __future__ import annotations

from typing import Any

import yaml

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab.rulenames import ALERT_ABSENT, ALERT_LOW, MODEL, r_ratio
from prefixwatch.mixin.alerttests import Cases
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.promtoolinput import MODEL as MODEL_NAME
from prefixwatch.mixin.promtoolinput import STEP, Phase
from prefixwatch.mixin.sources import EXPORTER_JOB

CLUSTERS = ("eu-1", "us-1")


def _cases(source: str, cfg: MixinConfig, rule_file: str, cluster: str) -> Cases:
    assert cfg.cluster_label
    cases = Cases(source, cfg, rule_file)
    cases.extra = {cfg.cluster_label: cluster}
    return cases


def _liveness(cases: Cases, minutes: float, vanish: bool = False) -> list[dict[str, str]]:
    if not cases.src.target_up:
        return []
    n = round(minutes * 60 / STEP)
    return [{"series": cases.series_name(cases.src.liveness, {**EXPORTER_JOB, **cases.extra}),
             "values": f"1+0x{n}" + (" stale" if vanish else "")}]


def tests(source: str, cfg: MixinConfig, rule_file: str) -> list[dict[str, Any]]:
    if not cfg.cluster_label:
        raise ConfigError("the multi-cluster tests need a cluster_label")
    label = cfg.cluster_label
    eu, us = (_cases(source, cfg, rule_file, c) for c in CLUSTERS)
    model = {"model_name": MODEL_NAME}
    out: list[dict[str, Any]] = []
    # 1. us-1 collapses at 60m, eu-1 stays healthy, same model and replica names: one page,
    #    for us-1, naming us-1's diagnosis only (eu-1 diagnoses something else).
    collapse = [Phase(60, 1000, 0.89), Phase(30, 1000, 0.03)]
    healthy = [Phase(90, 1000, 0.89)]
    series = (eu.traffic(healthy) + us.traffic(collapse) + _liveness(eu, 90) + _liveness(us, 90)
              + [us.diagnosis("vllm-0:8000", "prefix_divergence", 61, 29),
                 eu.diagnosis("vllm-0:8000", "eviction_pressure", 0, 90)])
    paged = 66
    out.append({"interval": f"{STEP}s", "input_series": series, "alert_rule_test": [
        eu.at(ALERT_LOW, 58, []),
        us.at(ALERT_LOW, paged, [us.expect(ALERT_LOW, "critical", {label: CLUSTERS[1], **model},
                                           0.03, ["prefix_divergence"])]),
    ]})
    # 2. The fleet ratio sums before dividing, within each cluster: eu-1 3000 tokens/s at 90%
    #    and 1000 at 50% is 80% (not the 70% mean); us-1 1000 at 90% and 1000 at 30% is 60%.
    #    Across both clusters it would be 74%: no such series exists.
    series = (eu.traffic([Phase(30, 3000, 0.9)], "vllm-0:8000")
              + eu.traffic([Phase(30, 1000, 0.5)], "vllm-1:8000")
              + us.traffic([Phase(30, 1000, 0.9)], "vllm-0:8000")
              + us.traffic([Phase(30, 1000, 0.3)], "vllm-1:8000"))
    ratio = r_ratio(MODEL, "5m")
    out.append({"interval": f"{STEP}s", "input_series": series, "alert_rule_test": [],
                "promql_expr_test": [{"expr": f"round({ratio}, 0.001)", "eval_time": "20m",
                                      "exp_samples": [
                                          {"labels": f'{{{label}="{c}",model_name="{MODEL_NAME}"}}',
                                           "value": v} for c, v in zip(CLUSTERS, (0.8, 0.6),
                                                                       strict=True)]}]})
    # 3. us-1's series vanish at 30m while eu-1's go on: metrics-absent fires for us-1 only
    #    (no global absent(): eu-1 still has data).
    expected = [us.expect(ALERT_ABSENT, "warning", {label: CLUSTERS[1], **model}, 1)]
    if us.src.target_up:
        expected.append(us.expect(ALERT_ABSENT, "warning", {label: CLUSTERS[1]}, 1))
    series = (eu.traffic([Phase(60, 1000, 0.9)]) + us.traffic([Phase(60, 1000, 0.9)],
                                                               vanish_after=30)
              + _liveness(eu, 60) + _liveness(us, 30, vanish=True))
    out.append({"interval": f"{STEP}s", "input_series": series, "alert_rule_test": [
        us.at(ALERT_ABSENT, 30, []), us.at(ALERT_ABSENT, 40, expected)]})
    return out


def render(source: str, rule_file: str, cfg: MixinConfig) -> str:
    doc = {"rule_files": [rule_file], "evaluation_interval": f"{STEP}s",
           "tests": tests(source, cfg, rule_file)}
    return (f"# Generated: promtool tests of the {source} rules with cluster_label "
            f"{cfg.cluster_label!r}.\n" + yaml.safe_dump(doc, sort_keys=False, width=1000))
