"""End to end with the real binaries on loopback: a bad deploy reaches the pager.

The simulator switches from static-system-prompt to timestamp-at-top; the exporter scrapes it;
a real Prometheus (started from the stack's prometheus/prometheus.yml, addresses adjusted for
loopback) evaluates the generated rules, compressed in time through the generator's config;
a real Alertmanager (the generated config) routes the page to a webhook inside this test.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from prefixwatch.core.vocab import rulenames
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin import alertmanager, rules
from prefixwatch.mixin import config as mixin_config
from prefixwatch.simulator.driver import Driver
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.scenarios import SCENARIOS
from prefixwatch.simulator.server import Replica, ReplicaServer
from tests.conftest import (
    require_binary,
    start_listening,
    start_prometheus,
    stop_processes,
    wait_ready,
)

ROOT = Path(__file__).parents[2]
TIME_SCALE = 0.05  # 5m windows become 15s, `for: 2m` becomes 6s


class Webhook:
    """Alertmanager's webhook receiver, recording every notification by path."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def alerts(self, path: str) -> list[dict]:
        return [a for p, msg in self.received if p == path for a in msg["alerts"]]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.integration
@pytest.mark.slow
def test_timestamp_regression_pages_on_call(tmp_path: Path) -> None:
    prometheus = require_binary("prometheus", "prometheus")
    am_binary = require_binary("prometheus-alertmanager", "prometheus-alertmanager")
    hook = Webhook()
    procs: list[subprocess.Popen] = []
    cfg = EngineConfig(prefill_tokens_per_s=1e6, time_per_output_token=0.001)
    sim = ReplicaServer(Replica(cfg), "127.0.0.1", 0)
    driver = Driver([sim.replica], SCENARIOS["static-system-prompt"], rate=25, seed=3,
                    switch_at=30, switch_to=SCENARIOS["timestamp-at-top"])
    exporter: Exporter | None = None
    try:
        sim.start()
        exporter = Exporter(ExporterConfig(
            targets=name_targets([TargetConfig(f"http://127.0.0.1:{sim.port}/metrics")]),
            interval=0.5, listen_address="127.0.0.1:0", windows=("1m",)))
        exporter.start()

        # The generated rules, compressed in time through the generator's own config.
        rules_cfg = mixin_config.MixinConfig(time_scale=TIME_SCALE)
        rules_dir = tmp_path / "rules"
        rules_dir.mkdir()
        (rules_dir / "prefixwatch.exporter.rules.yml").write_text(
            rules.render("exporter", rules_cfg))
        # The stack's Alertmanager config, with the pager URL from the environment.
        (tmp_path / "alertmanager.yml").write_text(alertmanager.render({
            alertmanager.ENV_PAGER: hook.url("/page"),
            alertmanager.ENV_TICKET: hook.url("/ticket"),
            alertmanager.ENV_WATCHDOG: hook.url("/watchdog")}, time_scale=TIME_SCALE))
        am = start_listening(
            [am_binary, f"--config.file={tmp_path / 'alertmanager.yml'}",
             f"--storage.path={tmp_path / 'am-data'}",
             "--web.listen-address=127.0.0.1:0", "--cluster.listen-address="])
        procs.append(am.proc)
        wait_ready(f"{am.url}/-/ready", am.proc)

        def prom_cfg(self_address: str) -> dict:
            """The stack's Prometheus config, addresses adjusted for loopback."""
            cfg = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
            cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
            cfg["rule_files"] = [str(rules_dir / "*.rules.yml")]
            cfg["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] = [
                f"127.0.0.1:{am.port}"]
            for job in cfg["scrape_configs"]:
                job["static_configs"][0]["targets"] = [
                    f"127.0.0.1:{exporter.port}" if job["job_name"] == "prefixwatch"
                    else self_address]
            return cfg

        prom = start_prometheus(prometheus, tmp_path / "prometheus.yml", prom_cfg,
                                f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                                "--rules.alert.resend-delay=2s")
        procs.append(prom.proc)
        wait_ready(f"{prom.url}/-/ready", prom.proc)
        driver.start()
        switched_at = None
        paged_before_switch: list[dict] = []
        deadline = time.monotonic() + 150
        pages: list[dict] = []
        while time.monotonic() < deadline:
            if switched_at is None and driver.scenario.name == "timestamp-at-top":
                switched_at = time.monotonic()
                paged_before_switch = list(hook.alerts("/page"))
            pages = [a for a in hook.alerts("/page") if a["status"] == "firing"]
            if pages and switched_at is not None:
                break
            time.sleep(0.5)
        assert switched_at is not None, "the workload never switched"
        assert pages, f"no page reached the webhook; received: {hook.received[-3:]}"
        page = pages[0]
        assert page["labels"]["alertname"] == rulenames.ALERT_LOW
        assert page["labels"]["severity"] == "critical"
        assert page["labels"]["model_name"] == cfg.model
        assert page["annotations"]["runbook_url"].endswith("runbooks.md#prefixcachehitratelow")
        assert paged_before_switch == [], "nothing pages during the healthy half minute"
        assert hook.alerts("/watchdog"), ("the Watchdog reaches its own receiver",
                                          [p for p, _ in hook.received])
    finally:
        driver.stop()
        if exporter is not None:
            exporter.stop()
        sim.stop()
        stop_processes(procs)
        hook.close()
