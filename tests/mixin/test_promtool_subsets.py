"""The rule subsets the generated promtool cases run with (tests/promtoolcases.py): each keeps
everything its assertions read, transitively, and is a fraction of the whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prefixwatch.mixin import sources
from tests.conftest import virtual_time
from tests.promtoolcases import RuleGraph, write_case_files

ALERTS = Path(__file__).parents[2] / "alerts"


def suite(source: str) -> tuple[RuleGraph, list[dict]]:
    path = ALERTS / "tests" / f"prefixwatch.{source}.test.yml"
    doc = yaml.safe_load(path.read_text())
    return RuleGraph([(path.parent / f).resolve() for f in doc["rule_files"]]), doc["tests"]


@pytest.mark.parametrize("source", sources.SOURCES)
def test_each_case_keeps_every_rule_its_assertions_read(source: str) -> None:
    graph, cases = suite(source)
    alerts = {r["alert"] for g in graph.groups for r in g["rules"] if "alert" in r}
    for case in cases:
        kept = graph.needed(case)
        named = {a["alertname"] for a in case.get("alert_rule_test", [])}
        assert named <= kept and named <= alerts | {"Watchdog"}, named - alerts
        for key in kept:
            assert graph.reads.get(key, set()) <= kept, (key, graph.reads[key] - kept)
        subset = graph.subset(kept)
        assert {r.get("record") or r["alert"] for g in subset["groups"] for r in g["rules"]
                } == kept & (graph.recorded | alerts)


def test_a_rule_read_through_an_annotation_query_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "r.yml"
    path.write_text(yaml.safe_dump({"groups": [
        {"name": "rec", "interval": "15s", "rules": [
            {"record": "a:x:rate5m", "expr": "rate(x[5m])"},
            {"record": "a:y:rate5m", "expr": "rate(y[5m])"},
            {"record": "a:z:ratio", "expr": "a:y:rate5m / 2"}]},
        {"name": "alerts", "rules": [
            {"alert": "A", "expr": "vector(1)",
             "annotations": {"description": '{{ with query "a:x:rate5m" }}{{ . }}{{ end }}'}}]},
    ]}))
    graph = RuleGraph([path])
    assert graph.needed({"alert_rule_test": [{"alertname": "A"}]}) == {"A", "a:x:rate5m"}
    assert graph.needed({"promql_expr_test": [{"expr": "a:z:ratio > 0"}]}) == {
        "a:z:ratio", "a:y:rate5m"}
    kept = graph.subset({"a:z:ratio", "a:y:rate5m"})
    assert kept == {"groups": [{"name": "rec", "interval": "15s", "rules": [
        {"record": "a:y:rate5m", "expr": "rate(y[5m])"},
        {"record": "a:z:ratio", "expr": "a:y:rate5m / 2"}]}]}


@pytest.mark.parametrize("source", sources.SOURCES)
def test_the_subsets_evaluate_a_fraction_of_the_rule_steps(source: str) -> None:
    """What the split saves: rule evaluations (rules x steps up to each case's last check)."""
    graph, cases = suite(source)
    every = sum(len(g["rules"]) for g in graph.groups)
    whole = kept = 0
    for case in cases:
        steps = virtual_time(case)
        whole += steps * every
        kept += steps * sum(len(g["rules"]) for g in graph.subset(graph.needed(case))["groups"])
    assert kept < 0.35 * whole


def test_a_case_file_names_only_the_groups_its_subset_kept(tmp_path: Path) -> None:
    path = tmp_path / "r.yml"
    path.write_text(yaml.safe_dump({"groups": [
        {"name": "rec", "rules": [{"record": "a:x:rate5m", "expr": "rate(x[5m])"}]},
        {"name": "alerts", "rules": [{"alert": "A", "expr": "vector(1)"}]}]}))
    doc = {"evaluation_interval": "15s", "group_eval_order": ["alerts", "rec"]}
    case = {"interval": "15s", "input_series": [],
            "promql_expr_test": [{"expr": "a:x:rate5m", "eval_time": "1m", "exp_samples": []}]}
    (written,) = write_case_files(doc, [case], RuleGraph([path]), tmp_path, "t")
    test = yaml.safe_load(written.read_text())
    assert test["group_eval_order"] == ["rec"] and test["evaluation_interval"] == "15s"
    assert test["tests"] == [case]
    (rules,) = test["rule_files"]
    assert [g["name"] for g in yaml.safe_load(Path(rules).read_text())["groups"]] == ["rec"]
