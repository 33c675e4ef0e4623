"""The exporter scraping the simulator over HTTP shows each scenario's hit rate."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from prefixwatch.exporter.config import TargetConfig
from prefixwatch.exporter.monitor import TargetMonitor
from prefixwatch.simulator.driver import Driver
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.scenarios import SCENARIOS
from prefixwatch.simulator.server import Replica, ReplicaServer


def measure(scenario: str, seconds: float = 4.0, rate: float = 40.0,
            switch_to: str | None = None) -> float:
    sc = SCENARIOS[scenario]
    cfg = EngineConfig(num_blocks=sc.num_blocks or 8192, prefill_tokens_per_s=1e6,
                       time_per_output_token=0.001)
    servers = [ReplicaServer(Replica(cfg, index=i, lora_modules=sc.lora_modules),
                             "127.0.0.1", 0) for i in range(sc.replicas)]
    for s in servers:
        s.start()
    monitors = [TargetMonitor(TargetConfig(f"http://127.0.0.1:{s.port}/metrics",
                                           name=f"r{s.replica.index}"), {"w": 3600.0}, 1.0)
                for s in servers]
    driver = Driver([s.replica for s in servers], sc, rate, seed=5,
                    switch_at=0.0 if switch_to else None,
                    switch_to=SCENARIOS[switch_to] if switch_to else None)
    try:
        driver.start()
        time.sleep(1.0)  # warm-up: the first requests fill the cache
        for m in monitors:
            m.poll()
        time.sleep(seconds)
        for m in monitors:
            m.poll()
    finally:
        driver.stop()
        for s in servers:
            s.stop()
    views = [m.view for m in monitors]
    assert all(v.up for v in views)
    queries = sum(v.models[cfg.model].windows["w"].queries for v in views)
    hits = sum(v.models[cfg.model].windows["w"].hits for v in views)
    assert queries > 0
    return hits / queries


@pytest.mark.integration
def test_healthy_baseline_is_high() -> None:
    assert 0.80 <= measure("static-system-prompt") <= 0.95


@pytest.mark.integration
def test_timestamp_at_top_collapses() -> None:
    assert measure("timestamp-at-top") < 0.05


@pytest.mark.integration
def test_round_robin_below_prefix_affinity() -> None:
    rr = measure("round-robin", seconds=5, rate=60)
    affinity = measure("prefix-affinity", seconds=5, rate=60)
    assert affinity - rr > 0.15


def status_of_a_simulated_server(cfg: EngineConfig, gap: str, warm_up: float = 0.0
                                 ) -> subprocess.CompletedProcess:
    """`prefixwatch status` on one replica running the healthy workload."""
    srv = ReplicaServer(Replica(cfg), "127.0.0.1", 0)
    srv.start()
    driver = Driver([srv.replica], SCENARIOS["static-system-prompt"], 30, seed=2)
    driver.start()
    try:
        time.sleep(warm_up)
        url = f"http://127.0.0.1:{srv.port}/metrics"
        return subprocess.run([sys.executable, "-m", "prefixwatch.cli", "status", "--target",
                               url, "--gap", gap], capture_output=True, text=True, timeout=60)
    finally:
        driver.stop()
        srv.stop()


@pytest.mark.integration
def test_status_command_prints_the_figures() -> None:
    cfg = EngineConfig(prefill_tokens_per_s=1e6, time_per_output_token=0.001)
    r = status_of_a_simulated_server(cfg, "2", warm_up=1.0)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{cfg.model} (") and " over 2s; cause: " in lines[0], lines[0]
    assert lines[1] == "" and lines[2].split()[:3] == ["TARGET", "MODEL", "ENGINE"]
    row = lines[3]
    assert cfg.model in row and "vllm_v1" in row and "%" in row
    bad = subprocess.run([sys.executable, "-m", "prefixwatch.cli", "status", "--target",
                          "http://127.0.0.1:9/metrics", "--gap", "0.1"], capture_output=True,
                         text=True, timeout=60)
    assert bad.returncode == 1 and "connect" in bad.stdout
    assert "Diagnosis over the 2s gap" in r.stdout


@pytest.mark.integration
def test_status_prints_the_diagnosis() -> None:
    cfg = EngineConfig(prefill_tokens_per_s=1e6, time_per_output_token=0.001,
                       enable_prefix_caching=False)
    r = status_of_a_simulated_server(cfg, "1")
    assert r.returncode == 0, r.stderr
    diagnosis = r.stdout.split("Diagnosis over", 1)[1]
    assert "caching_disabled: prefix caching is switched off" in diagnosis
    assert "cold_start" in diagnosis  # the server started a second ago
