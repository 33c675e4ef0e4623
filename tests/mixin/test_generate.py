"""`prefixwatch generate`: one atomic writer of every committed artifact, and its drift check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from prefixwatch.mixin import artifacts

ROOT = Path(__file__).parents[2]


def generate(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prefixwatch.cli", "generate", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=120)


def test_generate_writes_every_artifact_away_from_the_source_tree(tmp_path: Path) -> None:
    """Run from an empty directory (as from an installed wheel): every artifact comes out, the
    same as what is committed, and nothing half-written is left behind."""
    r = generate("--out", "clone", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "clone"
    files = artifacts.render_all()
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(files)
    for rel, text in files.items():
        assert (out / rel).read_text() == text == (ROOT / rel).read_text(), rel


def test_check_names_each_drifted_file_and_exits_1(tmp_path: Path) -> None:
    assert generate("--out", str(tmp_path), cwd=tmp_path).returncode == 0
    clean = generate("--check", "--out", str(tmp_path), cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    (tmp_path / "alerts" / "alertmanager.yml").write_text("edited by hand\n")
    (tmp_path / "dashboards" / "prefixwatch-overview.json").unlink()
    r = generate("--check", "--out", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 1
    drifted = sorted(line.split()[1] for line in r.stderr.splitlines()
                     if line.startswith("drifted:"))
    assert drifted == ["alerts/alertmanager.yml", "dashboards/prefixwatch-overview.json"]
    assert (tmp_path / "alerts" / "alertmanager.yml").read_text() == "edited by hand\n"


def test_the_config_reaches_the_files_and_bad_config_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "mixin.yml").write_text("hit_ratio_threshold: 0.55\n")
    assert generate("--config", "mixin.yml", "--out", "o", cwd=tmp_path).returncode == 0
    assert "< 0.55" in (tmp_path / "o" / "alerts" / "prefixwatch.exporter.rules.yml").read_text()
    (tmp_path / "bad.yml").write_text("hit_ratio_threshold: [\n")
    r = generate("--config", "bad.yml", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "bad.yml" in r.stderr
