"""The generated exporter suite under a config unlike the default in every way an alert reads:
a cluster label on every aggregation, another threshold and a model's own threshold. The
rules and the cases it generates must still agree when promtool evaluates them: the
single-cluster cases (series with no cluster label) still page, at the moved threshold.

One run covers all three keys: each of them rewrites the same rules (the cluster joins every
``by``, the thresholds move the comparisons and the page texts), so a second full run per key
would evaluate the same expressions again for a minute of CPU each."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixwatch.mixin import artifacts
from prefixwatch.mixin.config import load_config
from tests.conftest import promtool_test_chunk, run_promtool

CFG = load_config(data={"cluster_label": "cluster", "hit_ratio_threshold": 0.5,
                        "models": {"coder-7b": {"threshold": 0.4}}})
PARTS = 3  # the whole exporter suite: in parts, on parallel workers


def test_the_config_reaches_the_rules_and_the_cases() -> None:
    """Not vacuous: the run below evaluates rules and cases that carry all three keys."""
    files = artifacts.render_all(CFG)
    rules_text = files[artifacts.rule_file("exporter")]
    cases = files["alerts/tests/prefixwatch.exporter.test.yml"]
    assert "by (cluster, model_name" in rules_text
    assert "< 0.5" in rules_text and 'model_name="coder-7b"} < 0.4' in rules_text
    assert "cluster" not in cases  # the single-cluster cases: series with no cluster label
    assert "50%" in cases and "70%" not in cases


@pytest.mark.slow
@pytest.mark.parametrize("part", range(PARTS), ids=lambda p: f"part{p + 1}of{PARTS}")
def test_the_generated_exporter_cases_pass_under_a_non_default_config(tmp_path: Path, part: int
                                                                       ) -> None:
    artifacts.write_files(artifacts.under(artifacts.render_all(CFG), "alerts"), tmp_path)
    if part == 0:
        check = run_promtool("check", "rules", str(tmp_path / "prefixwatch.exporter.rules.yml"))
        assert check.returncode == 0, check.stdout + check.stderr
    result = promtool_test_chunk(tmp_path / "tests" / "prefixwatch.exporter.test.yml", part,
                                 PARTS, tmp_path)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
