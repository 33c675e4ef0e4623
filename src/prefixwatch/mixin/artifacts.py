"""Every committed artifact of the mixin, from ONE MixinConfig: ``render_all(cfg)``.

``render_all`` returns ``{path relative to the repository: text}`` for the rule files, their
promtool tests, alertmanager.yml, the dashboards of every source, the Kubernetes manifests and
the compose Prometheus config. It reads no file of the source tree, so it works the same from an
installed wheel; ``prefixwatch rules``, ``prefixwatch dashboards`` and the drift tests are views
of it, and ``write_files``/``drifted`` are the writer and the check behind
``prefixwatch generate [--check]`` (mixin/cli.py).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from prefixwatch.mixin import alertmanager, alerttests, dashboards, rules, stack
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.sources import SOURCES

ALERTS_DIR = "alerts"
DASHBOARDS_DIR = "dashboards"


def rule_file(source: str) -> str:
    return f"{ALERTS_DIR}/prefixwatch.{source}.rules.yml"


def test_file(source: str) -> str:
    return f"{ALERTS_DIR}/tests/prefixwatch.{source}.test.yml"


def render_all(cfg: MixinConfig | None = None) -> dict[str, str]:
    """Every generated file, by its path relative to the repository root."""
    cfg = cfg or MixinConfig()
    files: dict[str, str] = {}
    for source in SOURCES:
        files[rule_file(source)] = rules.render(source, cfg)
        rel = "../" + rule_file(source).removeprefix(ALERTS_DIR + "/")
        files[test_file(source)] = alerttests.render(source, rel, cfg)
    files[f"{ALERTS_DIR}/alertmanager.yml"] = alertmanager.render(environ={}, cfg=cfg)
    for name, text in dashboards.render_all(cfg).items():
        files[f"{DASHBOARDS_DIR}/{name}"] = text
    files.update(stack.generated_files(cfg))
    return files


def under(files: Mapping[str, str], directory: str) -> dict[str, str]:
    """The files below ``directory``, by their path relative to it."""
    prefix = directory.rstrip("/") + "/"
    return {k.removeprefix(prefix): v for k, v in files.items() if k.startswith(prefix)}


def write_files(files: Mapping[str, str], root: Path) -> list[Path]:
    """Write every file under ``root``: all texts go to temporary siblings first, then each is
    renamed into place, so no reader ever sees a half-written file and a failure while writing
    leaves the old set untouched."""
    staged: list[tuple[Path, Path]] = []
    try:
        for rel, text in files.items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            staged.append((Path(tmp), path))
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    return [path for _, path in staged]


def drifted(files: Mapping[str, str], root: Path) -> list[str]:
    """The relative paths whose committed text differs from ``files`` (or is missing)."""
    out = []
    for rel, text in files.items():
        path = root / rel
        try:
            same = path.read_text(encoding="utf-8") == text
        except OSError:
            same = False
        if not same:
            out.append(rel)
    return out
