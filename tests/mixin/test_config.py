"""The one mixin config: documented key by key, and reaching every generated artifact."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path

import pytest
import yaml

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab.causes import DiagnosisThresholds
from prefixwatch.mixin import artifacts
from prefixwatch.mixin.config import TOP_KEYS, DashboardSettings, MixinConfig, load_config

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "alerts" / "mixin.example.yml"
#: "70%", 0.7 or 0.70 as a number (not 0.75, 10.7, v0.70.1).
SEVENTY = re.compile(r"(?<![\d.])(?:70 ?%|0\.70*(?![\d.]))")


def test_the_example_documents_every_key_and_holds_the_defaults() -> None:
    text = EXAMPLE.read_text()
    documented = set(re.findall(r"^ *([a-z_]+):", text, re.M))
    wanted = TOP_KEYS | {f.name for f in fields(DashboardSettings)} | {
        f.name for f in fields(DiagnosisThresholds) if f.name != "hit_ratio"} | {"window"}
    assert wanted <= documented, sorted(wanted - documented)
    for line in text.splitlines():  # every key line is commented, on it or just above
        if re.match(r"^ *[a-z_]+:", line) and "#" not in line:
            before = text.split(line)[0].rstrip("\n").splitlines()
            assert before and before[-1].lstrip().startswith("#"), line
    cfg = load_config(str(EXAMPLE))
    assert replace(cfg, models={}) == MixinConfig(diagnosis_overrides=cfg.diagnosis_overrides)
    assert cfg.diagnosis == MixinConfig().diagnosis
    assert cfg.models["qwen2.5-coder"].threshold == 0.5


def test_threshold_and_a_model_override_move_every_artifact() -> None:
    """Every artifact follows the threshold (the generated promtool cases pass with it:
    tests/mixin/test_nondefault_suite.py)."""
    default = artifacts.render_all(MixinConfig())
    assert any(SEVENTY.search(t) for t in default.values()), "the check is not vacuous"
    cfg = load_config(data={"hit_ratio_threshold": 0.5,
                            "models": {"coder-7b": {"threshold": 0.4}}})
    moved = artifacts.render_all(cfg)
    assert set(moved) == set(default)
    independent = {"alerts/alertmanager.yml", "prometheus/prometheus.yml",
                   "deploy/kubernetes/kustomization.yaml"}
    assert {p for p in moved if moved[p] != default[p]} == set(moved) - independent
    for path, text in moved.items():
        found = SEVENTY.findall(text)
        assert not found, (path, found)
    for path in ("alerts/prefixwatch.exporter.rules.yml", "dashboards/prefixwatch-overview.json",
                 "deploy/kubernetes/prometheusrule.yaml"):
        assert "coder-7b" in moved[path], path
    rules = yaml.safe_load(moved["alerts/prefixwatch.vllm.rules.yml"])
    low = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert"))
    assert '< 0.5' in low["expr"] and 'model_name="coder-7b"} < 0.4' in low["expr"]
    assert '"coder-7b" }}40%{{ else }}50%' in low["annotations"]["description"]
    overview = moved["dashboards/prefixwatch-overview.json"]
    assert "Red below 50%" in overview and '"value": 0.5' in overview
    sidecar = moved["deploy/kubernetes/vllm-with-prefixwatch.yaml"]
    assert "hit_ratio: 0.5" in sidecar


def test_every_alert_window_is_a_key() -> None:
    """Each window and ``for`` of the alerts comes from the config: other values move them all,
    and the default windows are then nowhere in the rules."""
    changed = {"warning_window": "20m", "warning_for": "16m", "regression_for": "11m",
               "eviction_for": "12m", "tier_for": "31m", "baseline_window": "3h",
               "baseline_offset": "2h", "critical_short_window": "3m",
               "critical_long_window": "7m", "critical_for": "90s", "cold_start": "9m",
               "regression_window": "6m", "windows": ["1m", "5m", "1h"]}
    cfg = load_config(data=changed)
    text = artifacts.render_all(cfg)["alerts/prefixwatch.vllm.rules.yml"]
    rules = [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    fors = {r["alert"] + r["labels"]["severity"]: r.get("for") for r in rules if "alert" in r}
    assert fors["PrefixCacheHitRateLowwarning"] == "16m"
    assert fors["PrefixCacheHitRateRegressionwarning"] == "11m"
    assert fors["PrefixCacheEvictionPressurewarning"] == "12m"
    assert fors["PrefixCacheTierIdlewarning"] == "31m"
    assert fors["PrefixCacheHitRateLowcritical"] == "1m30s"
    exprs = {r["alert"] + r["labels"]["severity"]: r["expr"] for r in rules if "alert" in r}
    assert "rate3m < 0.35" in exprs["PrefixCacheHitRateLowcritical"]
    assert "rate7m < 0.7" in exprs["PrefixCacheHitRateLowcritical"]
    assert exprs["PrefixCacheHitRateRegressionwarning"].split("\n")[0].endswith("rate6m")
    assert "rate3h_offset2h" in text and "[3h] offset 2h" in text
    for old in ("15m", "10m", "30m", "rate2h", "offset 1h", "rate2m"):
        assert old not in text, old


def test_render_all_reads_no_source_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From an empty working directory (as from a wheel) the same files come out."""
    monkeypatch.chdir(tmp_path)
    files = artifacts.render_all()
    assert artifacts.drifted(files, ROOT) == [], "run: prefixwatch generate"
    written = artifacts.write_files(files, tmp_path / "out")
    assert len(written) == len(files) and not list((tmp_path / "out").rglob(".*"))
    assert artifacts.drifted(files, tmp_path / "out") == []
    (tmp_path / "out" / "alerts" / "alertmanager.yml").write_text("changed")
    assert artifacts.drifted(files, tmp_path / "out") == ["alerts/alertmanager.yml"]


def test_the_exporter_reads_the_same_threshold_keys(tmp_path: Path) -> None:
    from prefixwatch.exporter.config import ConfigFlags, build_config

    path = tmp_path / "exporter.yml"
    path.write_text("hit_ratio_threshold: 0.5\ncold_start: 3m\ndiagnosis: {min_requests: 5}\n")
    cfg = build_config(ConfigFlags(config_file=str(path)), environ={})
    assert cfg.thresholds.hit_ratio == 0.5 and cfg.cold_start == "3m"
    assert cfg.thresholds.min_requests == 5
    mixin = load_config(data={"hit_ratio_threshold": 0.5, "cold_start": "3m",
                              "diagnosis": {"min_requests": 5}})
    assert mixin.diagnosis.thresholds == cfg.thresholds
    path.write_text("hit_ratio_threshold: 0.5\ndiagnosis: {hit_ratio: 0.6}\n")
    assert build_config(ConfigFlags(config_file=str(path)), environ={}).thresholds.hit_ratio == 0.6
    path.write_text("hit_ratio_threshold: 1.5\n")
    with pytest.raises(ConfigError, match="hit_ratio_threshold must be between 0 and 1"):
        build_config(ConfigFlags(config_file=str(path)), environ={})
