"""End to end with a real Prometheus on loopback: a host tier that rescues the fleet does not
page, and a collapse of both tiers does.

The simulator runs the ``offload-rescue`` scenario (a device pool too small for 16 tenants, a
host tier of 8,192 blocks behind it) with vLLM 0.33's by-source counters; the exporter turns
them into ``prefixwatch_prompt_tokens_cached_total{tier}``; a real Prometheus evaluates the
generated exporter rules (default config: the effective ratio), compressed in time. Then the
workload switches to a timestamp at the top of every prompt: no tier can serve it, and the
critical page must follow.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from prefixwatch.core.vocab.rulenames import ALERT_LOW, MODEL, r_effective, r_ratio
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin import config as mixin_config
from prefixwatch.mixin import rules
from prefixwatch.simulator.driver import Driver
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.scenarios import SCENARIOS
from prefixwatch.simulator.server import Replica, ReplicaServer
from tests.conftest import require_binary, start_listening, wait_ready

TIME_SCALE = 0.05  # 5m windows become 15 s, the critical `for: 1m` 3 s, 2.5 minutes 7.5 s
HEALTHY_SECONDS = 40
THRESHOLD = mixin_config.MixinConfig().hit_ratio_threshold


def query(port: int, expr: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.load(resp)["data"]["result"]


def value(port: int, expr: str) -> float | None:
    result = query(port, expr)
    return float(result[0]["value"][1]) if result else None


@pytest.mark.integration
@pytest.mark.slow
def test_host_tier_rescue_stays_quiet_and_both_tiers_collapsing_pages(tmp_path: Path) -> None:
    prometheus = require_binary("prometheus", "prometheus")
    rescue = SCENARIOS["offload-rescue"]
    assert rescue.num_blocks and rescue.offload_blocks
    cfg = EngineConfig(prefill_tokens_per_s=1e6, time_per_output_token=0.001,
                       num_blocks=rescue.num_blocks, offload_blocks=rescue.offload_blocks)
    sim = ReplicaServer(Replica(cfg), "127.0.0.1", 0)
    driver = Driver([sim.replica], rescue, rate=25, seed=5, switch_at=HEALTHY_SECONDS,
                    switch_to=SCENARIOS["timestamp-at-top"])
    exporter: Exporter | None = None
    proc: subprocess.Popen | None = None
    try:
        sim.start()
        exporter = Exporter(ExporterConfig(
            targets=name_targets([TargetConfig(f"http://127.0.0.1:{sim.port}/metrics")]),
            interval=0.5, listen_address="127.0.0.1:0", windows=("1m",)))
        exporter.start()
        (tmp_path / "prefixwatch.exporter.rules.yml").write_text(
            rules.render("exporter", mixin_config.MixinConfig(time_scale=TIME_SCALE)))
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(tmp_path / "prefixwatch.exporter.rules.yml")],
            "scrape_configs": [{"job_name": "prefixwatch", "static_configs": [
                {"targets": [f"127.0.0.1:{exporter.port}"]}]}]}))
        started_prom = start_listening(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", "--web.listen-address=127.0.0.1:0"])
        proc, port = started_prom.proc, started_prom.port
        wait_ready(f"http://127.0.0.1:{port}/-/ready", proc)
        driver.start()
        started = time.monotonic()
        low = f'ALERTS{{alertname="{ALERT_LOW}",alertstate="firing"}}'
        # Healthy half: after a warm-up of one long window, no hit-rate page, while the device
        # ratio alone is below the threshold (a device-ratio rule would page).
        warm = 2 * 300 * TIME_SCALE
        fired_while_rescued: list[dict] = []
        device = effective = None
        while time.monotonic() - started < HEALTHY_SECONDS - 1:
            if time.monotonic() - started > warm:
                fired_while_rescued += query(port, low)
                device = value(port, f"{r_ratio(MODEL, '5m')}") or device
                effective = value(port, f"{r_effective(MODEL, '5m')}") or effective
            time.sleep(1)
        assert device is not None and effective is not None, "no recorded ratios"
        assert device < THRESHOLD <= effective, (device, effective)
        assert fired_while_rescued == [], fired_while_rescued
        # Both tiers collapse: the critical page follows. How soon (2.5 minutes) is the
        # generated promtool case's check, in virtual time; here the wall clock only bounds
        # the wait (10 scaled minutes), as the real pipeline's delays grow on a loaded machine.
        while driver.scenario.name != "timestamp-at-top" and time.monotonic() - started < 60:
            time.sleep(0.2)
        assert driver.scenario.name == "timestamp-at-top", "the workload never switched"
        switched = time.monotonic()
        paged_after = None
        while time.monotonic() - switched < 30:
            firing = [a for a in query(port, low) if a["metric"]["severity"] == "critical"]
            if firing:
                paged_after = time.monotonic() - switched
                break
            time.sleep(0.5)
        assert paged_after is not None, "both tiers collapsed and nothing paged"
    finally:
        driver.stop()
        if exporter is not None:
            exporter.stop()
        sim.stop()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
