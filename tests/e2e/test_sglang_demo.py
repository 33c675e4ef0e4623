"""`prefixwatch demo --engine sglang`: simulated SGLang replicas (its radix cache, /metrics and
KV events) regress the same way, and the same alert pages on call, with the real Prometheus
and Alertmanager; SIGTERM stops every process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prefixwatch.mixin import alertmanager
from tests.conftest import free_port, require_binary
from tests.e2e.test_alerting_e2e import Webhook


@pytest.mark.integration
def test_the_sglang_demo_pages_on_a_simulated_regression(tmp_path: Path) -> None:
    require_binary("prometheus", "prometheus")
    require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    hook = Webhook()
    env = {**os.environ, alertmanager.ENV_PAGER: hook.url("/page"),
           alertmanager.ENV_WATCHDOG: hook.url("/watchdog")}
    env.pop("VLLM_TARGETS", None)
    env.pop("PREFIXWATCH_TARGETS", None)

    def demo() -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "prefixwatch.cli", "demo", "--engine", "sglang",
             "--sim-port", "0", "--listen-address", "127.0.0.1:0",
             "--prometheus-port", str(free_port()), "--alertmanager-port", str(free_port()),
             "--time-scale", "0.05", "--switch-at", "20s", "--rate", "20",
             "--data-dir", str(tmp_path / "data"), "--duration", "150s"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)

    proc = demo()
    try:
        deadline = time.monotonic() + 120
        pages: list[dict] = []
        retries = 2
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                _, err = proc.communicate()
                if proc.returncode != 2 or "is in use" not in err or not retries:
                    break
                retries -= 1
                proc = demo()
            pages = [a for a in hook.alerts("/page") if a["status"] == "firing"]
            if pages:
                break
            time.sleep(0.5)
        assert pages, f"no page; demo exited {proc.poll()}"
        assert pages[0]["labels"]["alertname"] == "PrefixCacheHitRateLow"
        assert pages[0]["labels"]["severity"] == "critical"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        hook.close()
    assert proc.returncode == 0, err[-2000:]
    assert "simulated SGLang replica 0" in out
    assert "demo stopped" in err
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "data") not in ps, "Prometheus or Alertmanager left running"
