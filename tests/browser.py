"""Headless Debian chromium for tests: a page's DOM after scripts ran, and a screenshot.

Console messages reach stderr with ``--enable-logging=stderr --v=0`` as ``CONSOLE`` lines;
a test fails on any of error level, and on an uncaught exception.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import require_binary

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--enable-logging=stderr", "--v=0")
_CONSOLE_ERROR = re.compile(r"CONSOLE.*(error|Uncaught)|Uncaught \w*Error", re.I)


@dataclass
class Loaded:
    dom: str
    console_errors: list[str]


def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
    chromium = require_binary("chromium", "chromium")
    with tempfile.TemporaryDirectory(prefix="pw-chromium-") as profile:
        return subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=timeout)


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if _CONSOLE_ERROR.search(line)]


def load(url: str, width: int = 1280, height: int = 900) -> Loaded:
    """The DOM chromium built from the page in a window of that size, and any console error
    it logged."""
    done = _run(["--dump-dom", f"--window-size={width},{height}", url])
    assert done.returncode == 0, done.stderr[-2000:]
    return Loaded(done.stdout, _errors(done.stderr))


def screenshot(url: str, path: Path, width: int = 1280, height: int = 900) -> list[str]:
    """A PNG of the page at ``path``; returns the console errors."""
    done = _run([f"--screenshot={path}", f"--window-size={width},{height}",
                 "--hide-scrollbars", url])
    assert path.exists() and path.stat().st_size > 0, done.stderr[-2000:]
    return _errors(done.stderr)


def non_blank(path: Path) -> bool:
    """More than one colour, and a good share of the pixels not background white."""
    from matplotlib import image

    pixels = image.imread(str(path))
    flat = pixels.reshape(-1, pixels.shape[-1])[:, :3]
    distinct = len({tuple(p) for p in flat[:: max(1, len(flat) // 20000)].round(2).tolist()})
    inked = (flat.mean(axis=1) < 0.9).mean()
    return distinct > 8 and inked > 0.01
