"""`prefixwatch demo --engine sglang`: simulated SGLang replicas (its radix cache, /metrics and
KV events) regress the same way, and the same alert pages on call, with the real Prometheus
and Alertmanager; SIGTERM stops every process."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.e2e.demorun import demo_until_page


@pytest.mark.integration
def test_the_sglang_demo_pages_on_a_simulated_regression(tmp_path: Path) -> None:
    run = demo_until_page(tmp_path, "--engine", "sglang")
    assert run.pages, f"no page; demo exited {run.returncode}"
    assert run.pages[0]["labels"]["alertname"] == "PrefixCacheHitRateLow"
    assert run.pages[0]["labels"]["severity"] == "critical"
    assert run.returncode == 0, run.err[-2000:]
    assert "simulated SGLang replica 0" in run.out
    assert "demo stopped" in run.err
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "data") not in ps, "Prometheus or Alertmanager left running"
