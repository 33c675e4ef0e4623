"""The hand-written promtool tests (alerts/tests/handwritten.*.test.yml): literal labels and
annotations of the default config's main alerts, against the committed rules."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from prefixwatch.mixin import rules
from prefixwatch.mixin.artifacts import render_all
from prefixwatch.mixin.config import MixinConfig
from tests.conftest import promtool_test_chunk

ROOT = Path(__file__).parents[2]
HANDWRITTEN = sorted((ROOT / "alerts" / "tests").glob("handwritten.*.test.yml"))


def test_there_are_hand_written_tests_and_generate_never_writes_them() -> None:
    assert HANDWRITTEN, "alerts/tests/handwritten.*.test.yml"
    generated = render_all()
    assert not [p for p in HANDWRITTEN if str(p.relative_to(ROOT)) in generated]


@pytest.mark.parametrize("path", HANDWRITTEN, ids=lambda p: p.name)
def test_hand_written_expectations_hold(path: Path, tmp_path: Path) -> None:
    """Each case with the rules it asserts (the file whole: .ci/run)."""
    r = promtool_test_chunk(path, 0, 1, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_changed_page_text_fails_them(tmp_path: Path) -> None:
    """The literal expectations are not vacuous: rules from another threshold fail them (the
    page comes later and says 60%)."""
    path = next(p for p in HANDWRITTEN if ".exporter." in p.name)
    (tmp_path / "tests").mkdir()
    shutil.copy(path, tmp_path / "tests" / path.name)
    (tmp_path / "prefixwatch.exporter.rules.yml").write_text(
        rules.render("exporter", MixinConfig(hit_ratio_threshold=0.6)))
    r = promtool_test_chunk(tmp_path / "tests" / path.name, 0, 1, tmp_path)
    assert r.returncode != 0 and "alertname: PrefixCacheHitRateLow" in r.stdout + r.stderr
