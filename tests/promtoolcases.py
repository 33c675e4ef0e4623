"""Each promtool test case with the rules it asserts, and every rule those read, transitively.

promtool evaluates every rule of a test file at every step of every case, up to the case's
last evaluation time: a generated suite of about 20 cases over 80-95 rules spends nearly all
its minute of CPU on rules the case never looks at (a dashboard's quantiles while a case
checks the page of a collapse). Here a case keeps the alerting rules it names (every rule of
that alert name), the recording rules its expressions and those rules read (their
expressions, labels and annotation templates), transitively, in the files' order and
groups. What a case asserts is evaluated exactly as in the whole file: a rule that feeds an
assertion is never left out, so an alert expected to stay quiet is not quiet for want of its
inputs.

What the subsets do not check is that every other rule also evaluates without error on each
case's data; the committed suites are run whole for that (``.ci/run``: ``promtool test rules``
on ``alerts/tests/*.yml``, the users' own command)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

#: A PromQL metric or recorded-series name.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _rule_key(rule: dict[str, Any]) -> str:
    return rule.get("record") or rule["alert"]


def _reads(text: str, recorded: set[str]) -> set[str]:
    return {t for t in _NAME.findall(text) if t in recorded}


class RuleGraph:
    """The rule groups of some rule files and which recorded series each rule reads."""

    def __init__(self, rule_files: list[Path]) -> None:
        self.groups: list[dict[str, Any]] = []
        for path in rule_files:
            self.groups += yaml.safe_load(path.read_text())["groups"]
        rules = [r for g in self.groups for r in g["rules"]]
        recorded = {r["record"] for r in rules if "record" in r}
        self.recorded = recorded
        self.reads: dict[str, set[str]] = {}
        for rule in rules:  # the whole rule: expr, labels, annotation templates' queries
            key = _rule_key(rule)
            self.reads.setdefault(key, set()).update(
                _reads(yaml.safe_dump(rule), recorded) - {key})

    def needed(self, case: dict[str, Any]) -> set[str]:
        """The rules (record or alert names) one test case evaluates."""
        todo = [a["alertname"] for a in case.get("alert_rule_test", [])]
        for test in case.get("promql_expr_test", []):
            todo += _reads(test["expr"], self.recorded)
        out: set[str] = set()
        while todo:
            key = todo.pop()
            if key not in out:
                out.add(key)
                todo += self.reads.get(key, ())
        return out

    def subset(self, keep: set[str]) -> dict[str, Any]:
        """A rule file of the kept rules, in their groups and order (empty groups left out)."""
        groups = []
        for group in self.groups:
            rules = [r for r in group["rules"] if _rule_key(r) in keep]
            if rules:
                groups.append({**group, "rules": rules})
        return {"groups": groups}


def write_case_files(doc: dict[str, Any], cases: list[dict[str, Any]], graph: RuleGraph,
                     tmp: Path, stem: str) -> list[Path]:
    """One promtool test file per case, each naming a rule file of what that case needs;
    the settings of ``doc`` (evaluation interval, group order) kept."""
    paths = []
    for i, case in enumerate(cases):
        subset = graph.subset(graph.needed(case))
        rules = tmp / f"{stem}.case{i}.rules.yml"
        rules.write_text(yaml.safe_dump(subset, width=1000))
        test = {**doc, "rule_files": [str(rules)], "tests": [case]}
        if "group_eval_order" in doc:  # only the groups the subset kept
            kept = {g["name"] for g in subset["groups"]}
            test["group_eval_order"] = [g for g in doc["group_eval_order"] if g in kept]
        path = tmp / f"{stem}.case{i}.yml"
        path.write_text(yaml.safe_dump(test, width=1000))
        paths.append(path)
    return paths
