"""Multi-cluster with the real binaries: two clusters, a global Prometheus federating both.

Each cluster runs simulated vLLM replicas, an exporter and its own Debian Prometheus with a
`cluster` external label (no rules there). A third Prometheus federates every `prefixwatch_*`
series from both and evaluates the mixin's rules generated with `cluster_label: cluster`, as a
Thanos or Mimir ruler would. One cluster's workload regresses (a timestamp at the top of the
prompt); the other stays healthy with two replicas of unequal hit rate and traffic.

Checks: the page fires for the regressed cluster only, with its cluster label; the healthy
cluster's fleet ratio is the sum of hits over the sum of queries across its replicas (not the
mean of their ratios) and never mixes in the other cluster's traffic.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests
import yaml

from prefixwatch.core.vocab import rulenames
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin import rules
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.simulator.driver import Driver
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.scenarios import SCENARIOS
from prefixwatch.simulator.server import Replica, ReplicaServer
from tests.conftest import (
    Listening,
    require_binary,
    start_listening,
    stop_processes,
    wait_ready,
)

TIME_SCALE = 0.05  # 1m windows become 3s, 5m become 15s, `for: 2m` becomes 6s
CLUSTER = "cluster"


@dataclass
class Cluster:
    """Simulated replicas, their exporter and a leaf Prometheus labelled with the cluster."""

    name: str
    servers: list[ReplicaServer] = field(default_factory=list)
    drivers: list[Driver] = field(default_factory=list)
    exporter: Exporter | None = None
    prom_port: int = 0

    def start(self, tmp: Path, prometheus: str, procs: list[subprocess.Popen]) -> None:
        for server in self.servers:
            server.start()
        targets = [TargetConfig(f"http://127.0.0.1:{s.port}/metrics") for s in self.servers]
        self.exporter = Exporter(ExporterConfig(
            targets=name_targets(targets), interval=0.5, listen_address="127.0.0.1:0",
            windows=("1m",)))
        self.exporter.start()
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                          "external_labels": {CLUSTER: self.name}},
               "scrape_configs": [{"job_name": "prefixwatch", "static_configs": [
                   {"targets": [f"127.0.0.1:{self.exporter.port}"]}]}]}
        path = tmp / f"{self.name}.yml"
        path.write_text(yaml.safe_dump(cfg))
        started = _prometheus(prometheus, path, tmp / f"{self.name}-data")
        procs.append(started.proc)
        self.prom_port = started.port
        wait_ready(f"http://127.0.0.1:{self.prom_port}/-/ready", started.proc)

    def stop(self) -> None:
        for driver in self.drivers:
            driver.stop()
        if self.exporter is not None:
            self.exporter.stop()
        for server in self.servers:
            server.stop()


def _prometheus(binary: str, config: Path, data: Path) -> Listening:
    """Prometheus on a port of its own choosing (these configs never name it)."""
    return start_listening([binary, f"--config.file={config}", f"--storage.tsdb.path={data}",
                            "--web.listen-address=127.0.0.1:0"])


def _query(port: int, expr: str) -> list[dict]:
    resp = requests.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr},
                        timeout=5)
    resp.raise_for_status()
    return resp.json()["data"]["result"]



@pytest.mark.integration
@pytest.mark.slow
def test_global_view_alerts_per_cluster_and_sums_before_dividing(tmp_path: Path) -> None:
    prometheus = require_binary("prometheus", "prometheus")
    procs: list[subprocess.Popen] = []
    engine = EngineConfig(prefill_tokens_per_s=1e6, time_per_output_token=0.001)
    # east: one replica whose prompts get a timestamp at the top after 25 s.
    east = Cluster("east", servers=[ReplicaServer(Replica(engine), "127.0.0.1", 0)])
    # west: two healthy-ish replicas of unequal traffic and hit rate (a mean of their ratios
    # differs from the fleet's sum over sum).
    west = Cluster("west", servers=[ReplicaServer(Replica(engine), "127.0.0.1", 0),
                                    ReplicaServer(Replica(engine), "127.0.0.1", 0)])
    try:
        for cluster in (east, west):
            cluster.start(tmp_path, prometheus, procs)
        mixin = MixinConfig(cluster_label=CLUSTER, time_scale=TIME_SCALE)
        rules_dir = tmp_path / "rules"
        rules_dir.mkdir()
        (rules_dir / "prefixwatch.exporter.rules.yml").write_text(rules.render("exporter", mixin))
        federate = {
            "job_name": "federate", "honor_labels": True, "metrics_path": "/federate",
            "params": {"match[]": ['{__name__=~"prefixwatch_.*"}']},
            "static_configs": [{"targets": [f"127.0.0.1:{c.prom_port}" for c in (east, west)]}]}
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "rule_files": [str(rules_dir / "*.rules.yml")], "scrape_configs": [federate]}
        (tmp_path / "global.yml").write_text(yaml.safe_dump(cfg))
        global_prom = _prometheus(prometheus, tmp_path / "global.yml", tmp_path / "global-data")
        procs.append(global_prom.proc)
        global_port = global_prom.port
        wait_ready(f"http://127.0.0.1:{global_port}/-/ready", global_prom.proc)

        east.drivers = [Driver([east.servers[0].replica], SCENARIOS["static-system-prompt"],
                               rate=25, seed=3, switch_at=15,
                               switch_to=SCENARIOS["timestamp-at-top"])]
        west.drivers = [Driver([west.servers[0].replica], SCENARIOS["static-system-prompt"],
                               rate=40, seed=4),
                        Driver([west.servers[1].replica], SCENARIOS["timestamp-at-top"],
                               rate=5, seed=5)]
        for driver in east.drivers + west.drivers:
            driver.start()

        low = f'ALERTS{{alertname="{rulenames.ALERT_LOW}",alertstate="firing"}}'
        deadline = time.monotonic() + 120
        firing: list[dict] = []
        while time.monotonic() < deadline:
            firing = _query(global_port, low)
            if firing:
                break
            time.sleep(1)
        assert firing, "the regressed cluster never paged through the global view"
        assert {a["metric"][CLUSTER] for a in firing} == {"east"}
        assert all(a["metric"]["severity"] == "critical" for a in firing)

        # The healthy cluster's fleet ratio: sum over sum across its two replicas.
        w = mixin.scaled("5m")
        recorded = _query(global_port, f'{rulenames.r_ratio(rulenames.MODEL, "5m")}'
                                       f'{{{CLUSTER}="west"}}')
        assert len(recorded) == 1 and recorded[0]["metric"][CLUSTER] == "west"
        by_hand = _query(global_port, (
            f'sum by ({CLUSTER}) (rate(prefixwatch_prefix_cache_hits_total{{{CLUSTER}="west"}}'
            f'[{w}])) / sum by ({CLUSTER}) (rate(prefixwatch_prefix_cache_queries_total'
            f'{{{CLUSTER}="west"}}[{w}]))'))
        mean = _query(global_port, (
            f'avg by ({CLUSTER}) (sum by ({CLUSTER}, target) (rate(prefixwatch_prefix_cache_hits'
            f'_total{{{CLUSTER}="west"}}[{w}])) / sum by ({CLUSTER}, target) (rate('
            f'prefixwatch_prefix_cache_queries_total{{{CLUSTER}="west"}}[{w}])))'))
        value, expected, averaged = (float(r[0]["value"][1]) for r in (recorded, by_hand, mean))
        assert value == pytest.approx(expected, abs=0.03)
        assert abs(averaged - expected) > 0.05, "the replicas' ratios must differ for this check"
        assert value > 0.5, "west stays healthy: no traffic of east mixed in"
        assert not [a for a in _query(global_port, low) if a["metric"][CLUSTER] == "west"]
    finally:
        for cluster in (east, west):
            cluster.stop()
        stop_processes(procs)
