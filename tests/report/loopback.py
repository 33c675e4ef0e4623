"""A regression on loopback: simulated vLLM replicas, the exporter and a real Prometheus with
the generated rules compressed in time, plus the simulator's truth sampled as it runs. With
``kv_events``, each replica publishes its KV event stream and the exporter follows it (the
ledger, and the culprit in words).

Shared by the report's end-to-end test and docs/make_figures.py (the README's figures).
"""

from __future__ import annotations

import bisect
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from prefixwatch.core.vocab import causes, settings
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin import config as mixin_config
from prefixwatch.mixin import rules, stack
from prefixwatch.simulator.driver import Driver
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.kvpublisher import KVEventsOptions
from prefixwatch.simulator.scenarios import SCENARIOS
from prefixwatch.simulator.server import Replica, ReplicaServer
from tests.conftest import start_prometheus, wait_ready


@dataclass
class Truth:
    """The replicas' own counters (summed), sampled every ``period`` seconds."""

    times: list[float] = field(default_factory=list)
    queries: list[float] = field(default_factory=list)
    hits: list[float] = field(default_factory=list)

    def ratio(self, start: float, end: float) -> float:
        i = max(bisect.bisect_left(self.times, start), 0)
        j = min(bisect.bisect_right(self.times, end) - 1, len(self.times) - 1)
        dq = self.queries[j] - self.queries[i]
        return (self.hits[j] - self.hits[i]) / dq


class LoopbackStack:
    """Start with ``start()``, drive the workload, read ``prom_url``, ``stop()`` at the end."""

    def __init__(self, workdir: Path, prometheus: str, replicas: int = 2, rate: float = 20.0,
                 time_scale: float = 0.05, interval: float = 1.0,
                 engine: EngineConfig | None = None, kv_events: bool = False) -> None:
        self.workdir = workdir
        self.prometheus = prometheus
        self.time_scale = time_scale
        self.interval = interval
        cfg = engine or EngineConfig(prefill_tokens_per_s=60_000, time_per_output_token=0.002)
        streams = KVEventsOptions("tcp://127.0.0.1:0") if kv_events else None
        self.replicas = [Replica(cfg, index=i, kv_events=streams) for i in range(replicas)]
        self.servers = [ReplicaServer(r, "127.0.0.1", 0) for r in self.replicas]
        self.driver = Driver(self.replicas, SCENARIOS["static-system-prompt"], rate=rate, seed=7)
        self.exporter: Exporter | None = None
        self.proc: subprocess.Popen | None = None
        self.prom_port = 0  # Prometheus's own choice, known once it listens (start())
        self.truth = Truth()
        self.firing_seen: dict[str, float] = {}
        #: When the workload changed (``switch``): the truth's own phase boundaries.
        self.switched_at: list[float] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def prom_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    @property
    def exporter_url(self) -> str:
        assert self.exporter is not None
        return f"http://127.0.0.1:{self.exporter.port}/"

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self.exporter = Exporter(ExporterConfig(
            targets=name_targets([TargetConfig(
                f"http://127.0.0.1:{s.port}/metrics",
                kv_events=r.kv_publisher.endpoint if r.kv_publisher is not None else None)
                for s, r in zip(self.servers, self.replicas, strict=True)]),
            interval=max(0.5, self.interval / 2), listen_address="127.0.0.1:0",
            # The paging window on the rules' clock, as the demo gives it: the landing page's
            # headline ratio is over the window that pages.
            windows=(mixin_config.prom_duration(
                parse_duration(settings.CRITICAL_SHORT_WINDOW) * self.time_scale),),
            # The diagnosis on the same compressed clock as the rules: a cold start that
            # outlasts the run would name cold_start for the whole story.
            cold_start=mixin_config.prom_duration(
                parse_duration(causes.COLD_START) * self.time_scale),
            diagnosis_window=mixin_config.prom_duration(
                parse_duration(causes.DIAGNOSIS_WINDOW) * self.time_scale)))
        self.exporter.start()
        rules_dir = self.workdir / "rules"
        rules_dir.mkdir(parents=True, exist_ok=True)
        (rules_dir / "prefixwatch.exporter.rules.yml").write_text(
            rules.render("exporter", mixin_config.MixinConfig(time_scale=self.time_scale)))
        every = mixin_config.prom_duration(self.interval)
        started = start_prometheus(
            self.prometheus, self.workdir / "prometheus.yml",
            lambda self_address: stack.prometheus_config(
                f"127.0.0.1:{self.exporter.port}", None, [str(rules_dir / "*.rules.yml")],
                scrape_interval=every, evaluation_interval=every, self_address=self_address),
            f"--storage.tsdb.path={self.workdir / 'prom-data'}")
        self.proc, self.prom_port = started.proc, started.port
        wait_ready(f"{self.prom_url}/-/ready", self.proc)
        self.driver.start()
        for target in (self._sample_truth, self._watch_alerts):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)

    def switch(self, scenario: str) -> float:
        """Change the workload now (a bad deploy, or its rollback); returns the time."""
        self.driver.scenario = SCENARIOS[scenario]
        self.switched_at.append(time.time())
        return self.switched_at[-1]

    def _sample_truth(self) -> None:
        while not self._stop.wait(0.25):
            q = sum(r.engine.stats.prefix_queries for r in self.replicas)
            h = sum(r.engine.stats.prefix_hits for r in self.replicas)
            self.truth.times.append(time.time())
            self.truth.queries.append(q)
            self.truth.hits.append(h)

    def _watch_alerts(self) -> None:
        """The moment each alert was first seen firing (the test's reference)."""
        while not self._stop.wait(0.2):
            try:
                alerts = requests.get(f"{self.prom_url}/api/v1/alerts", timeout=2).json()
            except (requests.RequestException, ValueError):
                continue
            for alert in alerts.get("data", {}).get("alerts", []):
                name = alert["labels"].get("alertname", "")
                if alert.get("state") == "firing" and name not in self.firing_seen:
                    self.firing_seen[name] = time.time()

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
            time.sleep(0.2)

    def query(self, expr: str) -> list[dict]:
        """An instant query's result now ([] when Prometheus does not answer)."""
        try:
            return requests.get(f"{self.prom_url}/api/v1/query", params={"query": expr},
                                timeout=2).json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError):
            return []

    def fleet_ratio_now(self, window: str = "5s") -> float | None:
        expr = (f"sum(rate(prefixwatch_prefix_cache_hits_total[{window}])) / "
                f"sum(rate(prefixwatch_prefix_cache_queries_total[{window}]))")
        try:
            result = requests.get(f"{self.prom_url}/api/v1/query", params={"query": expr},
                                  timeout=2).json()["data"]["result"]
        except (requests.RequestException, ValueError, KeyError):
            return None
        return float(result[0]["value"][1]) if result else None

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=2)
        self.driver.stop()
        if self.exporter is not None:
            self.exporter.stop()
        for server in self.servers:
            server.stop()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
