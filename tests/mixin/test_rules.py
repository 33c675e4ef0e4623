"""The generated rules and Alertmanager config, checked by the real promtool and amtool."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from prefixwatch.core.vocab import rulenames
from prefixwatch.mixin import alertmanager, alerttests, promtoolinput, rules, sources
from prefixwatch.mixin import config as mixin_config
from prefixwatch.mixin.cli import write_all
from tests.conftest import promtool_test_chunk, require_binary, run_promtool, split_cases

ROOT = Path(__file__).parents[2]
ALERTS = ROOT / "alerts"


@pytest.fixture(scope="module")
def amtool() -> str:
    return require_binary("amtool", "prometheus-alertmanager")


def test_committed_files_match_the_generator(tmp_path: Path) -> None:
    written = write_all(tmp_path, mixin_config.MixinConfig())
    assert len(written) == 7
    for path in written:
        committed = ALERTS / path.relative_to(tmp_path)
        hint = "run: prefixwatch generate"
        assert committed.exists(), f"{committed} is missing: {hint}"
        assert committed.read_text() == path.read_text(), (
            f"{committed} drifted from the generator: {hint}")


def test_every_alert_has_a_test_and_a_runbook_section() -> None:
    runbook = (ROOT / "docs" / "runbooks.md").read_text()
    for source in sources.SOURCES:
        doc = yaml.safe_load((ALERTS / f"prefixwatch.{source}.rules.yml").read_text())
        alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
        tests = yaml.safe_load((ALERTS / "tests" / f"prefixwatch.{source}.test.yml").read_text())
        tested = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])
                  if t["exp_alerts"]}
        for alert in alerts:
            assert alert["alert"] in tested, f"{alert['alert']} never shown firing ({source})"
            assert alert["alert"][0].isupper() and "_" not in alert["alert"]
            assert alert["labels"]["severity"] in ("critical", "warning", "none")
            assert set(alert["annotations"]) == {"summary", "description", "runbook_url"}
            anchor = alert["annotations"]["runbook_url"].split("#")[1]
            assert f"## {alert['alert']}".lower() == f"## {anchor}"
            assert f"## {alert['alert']}\n" in runbook
        records = [r["record"] for g in doc["groups"] for r in g["rules"] if "record" in r]
        assert all(len(name.split(":")) == 3 for name in records), "level:metric:operations"


def test_every_cause_has_a_runbook_section_and_the_alerts_link_it() -> None:
    from prefixwatch.core.vocab.causes import CAUSE_NAMES

    runbook = (ROOT / "docs" / "runbooks.md").read_text()
    for cause in CAUSE_NAMES:
        assert f"\n### {cause}\n" in runbook, f"no runbook section for {cause}"
        assert f"| `{cause}` |" in runbook, f"{cause} missing from the rule table"
    doc = yaml.safe_load((ALERTS / "prefixwatch.vllm.rules.yml").read_text())
    named = [r for g in doc["groups"] for r in g["rules"]
             if "alert" in r and "Diagnosis:" in r["annotations"]["description"]]
    assert {r["alert"] for r in named} == {rulenames.ALERT_LOW, rulenames.ALERT_REGRESSION,
                                           rulenames.ALERT_OUTLIER}
    for rule in named:
        assert f"{rulenames.DEFAULT_RUNBOOK_URL}#{{{{ $s.Labels.cause }}}}" in (
            rule["annotations"]["description"])


@pytest.mark.parametrize("source", sources.SOURCES)
def test_promtool_checks_the_rules(source: str) -> None:
    check = run_promtool("check", "rules", str(ALERTS / f"prefixwatch.{source}.rules.yml"))
    assert check.returncode == 0, check.stdout + check.stderr


#: Each source's generated suite runs in parts on parallel workers (a minute of CPU each).
PARTS = 3


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS), ids=lambda p: f"part{p + 1}of{PARTS}")
@pytest.mark.parametrize("source", sources.SOURCES)
def test_promtool_unit_tests(source: str, part: int, tmp_path: Path) -> None:
    test = promtool_test_chunk(ALERTS / "tests" / f"prefixwatch.{source}.test.yml", part,
                               PARTS, tmp_path)
    assert test.returncode == 0, test.stdout + test.stderr


@pytest.mark.parametrize("source", sources.SOURCES)
def test_the_parts_hold_every_case_once(source: str) -> None:
    """Splitting drops no case of a suite, runs none twice, and shares the time out."""
    cases = yaml.safe_load((ALERTS / "tests" / f"prefixwatch.{source}.test.yml").read_text())[
        "tests"]
    parts = split_cases(cases, PARTS)
    assert sorted(map(repr, (c for part in parts for c in part))) == sorted(map(repr, cases))
    assert all(parts), "an empty part"


def test_per_model_thresholds_opt_outs_and_selector(tmp_path: Path) -> None:
    cfg_path = tmp_path / "cfg.yml"
    cfg_path.write_text(textwrap.dedent("""\
        selectors: {matchers: 'job="vllm"'}
        models:
          embedder: {disabled: true}
          "coder.v2": {threshold: 0.3}
    """))
    cfg = mixin_config.load_config(str(cfg_path))
    (tmp_path / "r.yml").write_text(rules.render("vllm", cfg))
    cases = alerttests.Cases("vllm", cfg, "r.yml")

    def traffic(model: str, ratio: float, job: str = "vllm") -> list[dict[str, str]]:
        series = cases.traffic([promtoolinput.Phase(40, 1000, ratio)], target=f"{model}:8000")
        for s in series:
            s["series"] = s["series"].replace(alerttests.MODEL, model).replace(
                'job="vllm"', f'job="{job}"')
        return series

    series = (traffic("embedder", 0.0) + traffic("coder.v2", 0.4) + traffic("chat", 0.5)
              + traffic("other-job", 0.0, job="batch"))
    firing = [cases.expect(rulenames.ALERT_LOW, "critical", {"model_name": "chat"}, 0.5)]
    doc = {"rule_files": ["r.yml"], "evaluation_interval": "15s", "tests": [{
        "interval": "15s", "input_series": series,
        "alert_rule_test": [cases.at(rulenames.ALERT_LOW, 10, firing)]}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, width=1000))
    result = run_promtool("test", "rules", str(tmp_path / "t.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    # The same 0.2 ratio does fire for the model with a 0.3 threshold.
    series = traffic("coder.v2", 0.2)
    doc["tests"][0]["input_series"] = series
    doc["tests"][0]["alert_rule_test"] = [cases.at(rulenames.ALERT_LOW, 10, [
        cases.expect(rulenames.ALERT_LOW, "critical", {"model_name": "coder.v2"}, 0.2)])]
    (tmp_path / "t.yml").write_text(yaml.safe_dump(doc, width=1000))
    result = run_promtool("test", "rules", str(tmp_path / "t.yml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alertmanager_config_and_routes(amtool: str, tmp_path: Path) -> None:
    path = str(ALERTS / "alertmanager.yml")
    check = subprocess.run([amtool, "check-config", path], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    for labels, receiver in (
            (["alertname=PrefixCacheHitRateLow", "severity=critical", "model_name=m"], "pager"),
            (["alertname=PrefixCacheHitRateLow", "severity=warning", "model_name=m"], "ticket"),
            (["alertname=PrefixCacheReplicaOutlier", "severity=warning"], "ticket"),
            (["alertname=Watchdog", "severity=none"], "watchdog")):
        out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={path}",
                              *labels], capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == receiver, (labels, out.stdout)
    text = alertmanager.render({alertmanager.ENV_PAGER: "https://pager.example/hook"})
    assert "https://pager.example/hook" in text and "ticket.prefixwatch.invalid" in text
    rendered = tmp_path / "am.yml"
    rendered.write_text(text)
    assert subprocess.run([amtool, "check-config", str(rendered)],
                          capture_output=True).returncode == 0
    committed = (ALERTS / "alertmanager.yml").read_text()
    assert "PagerDuty" in committed and "slack_configs" in committed


@pytest.mark.parametrize("content,message", [
    ("threshold: 0.5\n", ":1:1: unknown key 'threshold' (did you mean 'hit_ratio_threshold'?)"),
    ("hit_ratio_threshold: 0\n", "c.yml:1:1: hit_ratio_threshold must be between 0 and 1"),
    ("tresholds: 0.5\n", "unknown key 'tresholds'"),
    ("models: {m: {threshold: 0.5, page: false}}\n", "c.yml:1:30: unknown key 'models.m.page'"),
    ("models:\n  m: {threshold: 2}\n", "c.yml:2:3: models.m.threshold must be between"),
    ("cold_start: soon\n", "not a duration"),
    ("selectors:\n  matchers: 'job=vllm'\n", "c.yml:2:3: matchers"),
    ("cluster_label: model_name\n", "cluster_label must be a label name"),
    ("warning_window: soon\n", "c.yml:1:1: warning_window: not a duration"),
    ("critical_collapse_share: 1.2\n", "c.yml:1:1: critical_collapse_share must be between"),
    ("evaluation_interval: 30s\n", "c.yml:1:1: critical_short_window must hold at least 4 "
                                   "evaluation intervals (2m at evaluation_interval 30s)"),
    ("diagnosis: {evict_idle_seconds: -1}\n", "c.yml:1:1: diagnosis: min_requests >= 1"),
    ("diagnosis: {windw: 5m}\n", "c.yml:1:13: unknown key 'diagnosis.windw' (did you mean "
                                 "'window'?)"),
    ("runbook_url_pattern: https://x/runbooks\n", "needs {anchor}"),
    ("dashboards: {refresh: often}\n", "dashboards.refresh"),
    ("hit_ratio_threshold: [\n", "c.yml:2:1: not valid YAML"),
])
def test_bad_rules_config_exits_2(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(content)
    r = subprocess.run([sys.executable, "-m", "prefixwatch.cli", "rules", "--config", str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and message in r.stderr, r.stderr


def test_threshold_flag_and_out_file(tmp_path: Path) -> None:
    out = tmp_path / "r.yml"
    r = subprocess.run([sys.executable, "-m", "prefixwatch.cli", "rules", "--source", "sglang",
                        "--threshold", "0.6", "--out", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "sglang:cached_tokens_total" in text and "< 0.6" in text and "< 0.7" not in text


def test_prom_duration() -> None:
    assert mixin_config.prom_duration(90) == "1m30s"
    assert mixin_config.prom_duration(3600 * 2 + 1) == "2h1s"
    assert mixin_config.prom_duration(0.5) == "500ms"
