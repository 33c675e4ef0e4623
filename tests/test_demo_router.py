"""`prefixwatch demo --router`: a real router between the workload and the replicas, or one
line saying how to install it."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import require_binary
from tests.test_cli import run


def test_a_missing_router_says_how_to_install_it(monkeypatch, capsys) -> None:
    from prefixwatch import cli
    from prefixwatch.demo import routers

    monkeypatch.setattr(routers.shutil, "which", lambda name: None)
    code = cli.main(["demo", "--router", "smg", "--no-prometheus", "--sim-port", "0",
                     "--listen-address", "127.0.0.1:0"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == ("prefixwatch demo: error: smg is not installed: pip install "
                           "'prefixwatch[routers]' (or pip install smg==1.13.0)")


def test_a_router_needs_the_simulated_replicas() -> None:
    r = run("demo", "--router", "vllm-router", "--vllm", "http://127.0.0.1:9/metrics",
            "--no-prometheus")
    assert r.returncode == 2 and "cannot be combined with --vllm" in r.stderr


@pytest.mark.integration
@pytest.mark.slow
def test_demo_routes_through_the_real_router(tmp_path) -> None:
    """smg in front of the two replicas: the exporter reads it as a router target, its workers
    matched to the replicas; at the (scaled) switch it is restarted with round_robin and the
    ledger's routing part grows; SIGTERM ends the demo, the router too, within the demo's
    shutdown deadline."""
    require_binary("smg", "pip install '.[routers]'")
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefixwatch.cli", "demo", "--router", "smg", "--no-prometheus",
         "--sim-port", "0", "--listen-address", "127.0.0.1:0", "--time-scale", "0.05",
         "--switch-at", "5m", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 40
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append(line)
            if "routing degrades: smg restarted with --policy round_robin" in line or (
                    time.monotonic() > deadline):
                break
        text = "".join(lines)
        assert "through smg (prefix_hash)" in text, text[-3000:]
        assert "routing degrades" in text, text[-3000:]
        port = re.search(r"exporter:\s+http://127\.0\.0\.1:(\d+)/", text).group(1)
        router = re.search(r"router:\s+smg \S+ at (http://[0-9.:]+)", text).group(1)
        import requests

        time.sleep(4)
        page = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert 'prefixwatch_router_info{kind="smg",router="router"} 1.0' in page
        matched = re.findall(r"^prefixwatch_router_worker_target\{.*\} 1\.0$", page, re.M)
        assert len(matched) == 2, page
        routing = sum(float(v) for v in re.findall(
            r'^prefixwatch_kv_computed_tokens_total\{[^}]*part="routing"[^}]*\} (\S+)$', page,
            re.M))
        assert routing > 0, "round-robin computes tenants' prefixes the other replica holds"
    finally:
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=10)[0]
    # Every part, the router too, stopped within the demo's shutdown deadline (1.5 s).
    assert "demo stopped" in rest and "left behind" not in rest, rest[-2000:]
    import requests

    with pytest.raises(requests.ConnectionError):  # the router went with the demo
        requests.get(router + "/health", timeout=2)
