"""cluster_label: every aggregation keeps the cluster, checked by the real promtool."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from prefixwatch.mixin import alertmanager, artifacts, clustertests, rules
from prefixwatch.mixin.config import MixinConfig, load_config
from prefixwatch.mixin.sources import SOURCES
from tests.conftest import promtool_test_chunk, run_promtool

CFG = load_config(data={"cluster_label": "cluster"})


def promtool_test(tmp_path: Path, source: str, tests_text: str, cfg: MixinConfig) -> None:
    """The rules of ``cfg`` checked, then the cases, each with the rules it asserts. (The
    single-cluster suite under a cluster label: tests/mixin/test_nondefault_suite.py.)"""
    (tmp_path / "r.yml").write_text(rules.render(source, cfg))
    (tmp_path / "t.yml").write_text(tests_text)
    check = run_promtool("check", "rules", str(tmp_path / "r.yml"))
    assert check.returncode == 0, check.stdout + check.stderr
    result = promtool_test_chunk(tmp_path / "t.yml", 0, 1, tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.parametrize("source", SOURCES)
def test_two_clusters_alert_separately_and_sum_within_each(tmp_path: Path, source: str) -> None:
    promtool_test(tmp_path, source, clustertests.render(source, "r.yml", CFG), CFG)


def test_every_aggregation_keeps_the_cluster() -> None:
    files = artifacts.render_all(CFG)
    for source in SOURCES:
        doc = yaml.safe_load(files[artifacts.rule_file(source)])
        for rule in (r for g in doc["groups"] for r in g["rules"]):
            expr = rule["expr"]
            for clause in re.findall(r"\b(?:by|on) \(([^)]*)\)", expr):
                if clause or "group_left" not in expr:
                    assert clause.startswith("cluster"), (source, rule.get("record"), clause)
    am = alertmanager.config({}, cfg=CFG)
    assert am["route"]["group_by"][0] == "cluster"
    assert all(r["equal"][0] == "cluster" for r in am["inhibit_rules"])
    assert files["alerts/alertmanager.yml"] == alertmanager.render({}, cfg=CFG)


def test_dashboards_thread_a_cluster_variable_through_every_query() -> None:
    for name, text in artifacts.under(artifacts.render_all(CFG), "dashboards").items():
        dash = json.loads(text)
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        assert variables["cluster"]["query"].endswith(", cluster)"), name
        for var in ("job", "model", "instance"):
            assert 'cluster=~"$cluster"' in variables[var]["query"], (name, var)
        for title, expr in artifacts.dashboards.queries(dash):
            selectors = re.findall(r"[\w:]+\{([^}]*)\}", expr)
            assert selectors, (name, title, expr)
            for sel in selectors:
                assert 'cluster=~"$cluster"' in sel, (name, title, expr)
    default = artifacts.under(artifacts.render_all(), "dashboards")
    assert all("$cluster" not in text for text in default.values())
