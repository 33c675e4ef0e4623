"""`prefixwatch demo` run until its first page, with the real Prometheus and Alertmanager and a
webhook standing in for the pager (the native stack's paging tests, one per engine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from prefixwatch.mixin import alertmanager
from tests.conftest import free_port, require_binary
from tests.e2e.test_alerting_e2e import Webhook


@dataclass
class DemoRun:
    pages: list[dict]  # the firing pages the webhook received
    returncode: int | None
    out: str
    err: str


def demo_until_page(tmp_path: Path, *extra: str) -> DemoRun:
    """A demo (``extra`` flags added) on ports found free, until its first page, then
    SIGTERM. The demo takes Prometheus's and Alertmanager's ports as given (their configs name
    each other), so a port taken meanwhile is the demo's one-line "is in use" exit, and then
    it runs again on others."""
    require_binary("prometheus", "prometheus")
    require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    hook = Webhook()
    env = {**os.environ, alertmanager.ENV_PAGER: hook.url("/page"),
           alertmanager.ENV_WATCHDOG: hook.url("/watchdog")}
    env.pop("VLLM_TARGETS", None)
    env.pop("PREFIXWATCH_TARGETS", None)

    def demo() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "prefixwatch.cli", "demo", *extra, "--sim-port", "0",
             "--listen-address", "127.0.0.1:0", "--prometheus-port", str(free_port()),
             "--alertmanager-port", str(free_port()), "--time-scale", "0.05",
             "--switch-at", "20s", "--rate", "20", "--data-dir", str(tmp_path / "data"),
             "--duration", "150s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)

    proc = demo()
    out = err = ""
    pages: list[dict] = []
    try:
        deadline = time.monotonic() + 120
        retries = 2
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                out, err = proc.communicate()
                if proc.returncode != 2 or "is in use" not in err or not retries:
                    break
                retries -= 1
                proc = demo()
            pages = [a for a in hook.alerts("/page") if a["status"] == "firing"]
            if pages:
                break
            time.sleep(0.5)
        if pages:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        hook.close()
    return DemoRun(pages, proc.returncode, out, err)
