"""`prefixwatch demo`: the docker-compose stack on one machine, without Docker.

Simulator (unless a vLLM is given), exporter, and, when their binaries are installed, a real
Prometheus and Alertmanager started from the same configuration as the compose stack (the
generated rules, alertmanager.yml rendered from the environment, prometheus.yml with loopback
addresses). Grafana is not in Debian's package sources, so it is not started here: import
dashboards/*.json into a Grafana you have, or use docker compose.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import requests
import yaml

from prefixwatch.core import causes, names
from prefixwatch.core.errors import ConfigError
from prefixwatch.core.windows import parse_duration
from prefixwatch.exporter.config import build_config
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin import alertmanager, rules, stack
from prefixwatch.simulator.cli import build_simulation, simulation_args, wait_for_signal

log = logging.getLogger("prefixwatch.demo")

PROMETHEUS_BINARIES = ("prometheus",)
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")
INSTALL_HINT = "apt-get install prometheus prometheus-alertmanager"


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="run the whole stack on this machine, without Docker",
        description="Run the prefixwatch stack without Docker: simulator (or your vLLM), "
                    "exporter, and Prometheus and Alertmanager when installed, from the same "
                    "config as docker-compose.yml. With no --vllm, two simulated vLLM replicas "
                    "run a healthy chat workload that regresses after --switch-at (a timestamp "
                    "at the top of the system prompt), and the page reaches the webhook in "
                    "$PREFIXWATCH_PAGER_WEBHOOK_URL.")
    p.add_argument("--vllm", action="append", metavar="URL",
                   help="watch this vLLM /metrics URL instead of the simulator; repeat "
                        "(default: $VLLM_TARGETS or $PREFIXWATCH_TARGETS if set)")
    p.add_argument("--replicas", type=int, default=2, help="simulated replicas (default 2)")
    p.add_argument("--scenario", default="static-system-prompt",
                   help="workload before the switch (default static-system-prompt)")
    p.add_argument("--switch-to", default="timestamp-at-top",
                   help="workload after the switch (default timestamp-at-top)")
    p.add_argument("--switch-at", default="5m", metavar="DURATION",
                   help="when the regression lands (default 5m)")
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (default 4)")
    p.add_argument("--sim-port", type=int, default=8000,
                   help="first simulator port (default 8000; 0 = any free port)")
    p.add_argument("--listen-address", default=f"127.0.0.1:{names.DEFAULT_PORT}",
                   help=f"exporter address (default 127.0.0.1:{names.DEFAULT_PORT})")
    p.add_argument("--prometheus-port", type=int, default=9090,
                   help="Prometheus port on 127.0.0.1 (default 9090)")
    p.add_argument("--alertmanager-port", type=int, default=9093,
                   help="Alertmanager port on 127.0.0.1 (default 9093)")
    p.add_argument("--no-prometheus", action="store_true",
                   help="do not start Prometheus and Alertmanager even when installed")
    p.add_argument("--data-dir", metavar="DIR",
                   help="keep Prometheus and Alertmanager data here (default: a temporary "
                        "directory removed on exit)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="FACTOR",
                   help="compress rule windows, `for:` and scrape intervals by FACTOR (e.g. "
                        "0.05 to see a page within a minute); 1 = the real rules")
    p.add_argument("--duration", metavar="DURATION", help="stop after this long")


def _find(names: tuple[str, ...]) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Backends:
    """Prometheus and Alertmanager as child processes, with the stack's configuration."""

    def __init__(self, workdir: Path, exporter_port: int, prom_port: int, am_port: int,
                 time_scale: float) -> None:
        self.workdir = workdir
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.prom_port, self.am_port = prom_port, am_port
        self.scale = time_scale
        self.exporter_port = exporter_port

    def start(self, prometheus: str, am_binary: str) -> None:
        for port, what in ((self.prom_port, "Prometheus"), (self.am_port, "Alertmanager")):
            if not _port_free(port):
                raise ConfigError(f"port {port} for {what} is in use (see --prometheus-port, "
                                  "--alertmanager-port)")
        rules_dir = self.workdir / "rules"
        rules_dir.mkdir(parents=True, exist_ok=True)
        (rules_dir / "prefixwatch.exporter.rules.yml").write_text(
            rules.render("exporter", rules.RulesConfig(time_scale=self.scale)))
        (self.workdir / "alertmanager.yml").write_text(
            alertmanager.render(time_scale=self.scale))
        interval = rules.prom_duration(max(1.0, 15 * self.scale))
        cfg = stack.prometheus_config(
            f"127.0.0.1:{self.exporter_port}", f"127.0.0.1:{self.am_port}",
            [str(rules_dir / "*.rules.yml")], scrape_interval=interval,
            evaluation_interval=interval, self_address=f"127.0.0.1:{self.prom_port}")
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        self._spawn("alertmanager", [
            am_binary, f"--config.file={self.workdir / 'alertmanager.yml'}",
            f"--storage.path={self.workdir / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{self.am_port}", "--cluster.listen-address="],
            logs / "alertmanager.log")
        self._spawn("prometheus", [
            prometheus, f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{self.prom_port}",
            f"--rules.alert.resend-delay={rules.prom_duration(max(1.0, 60 * self.scale))}"],
            logs / "prometheus.log")
        for name, port in (("alertmanager", self.am_port), ("prometheus", self.prom_port)):
            self._wait_ready(name, f"http://127.0.0.1:{port}/-/ready", logs / f"{name}.log")

    def _spawn(self, name: str, argv: list[str], log_path: Path) -> None:
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT)
        self.procs.append((name, proc))

    def _wait_ready(self, name: str, url: str, log_path: Path) -> None:
        proc = dict(self.procs)[name]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-600:]
                raise ConfigError(f"{name} exited with status {proc.returncode}: {tail}")
            try:
                if requests.get(url, timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.2)
        raise ConfigError(f"{name} did not become ready within 30s (log: {log_path})")

    def stop(self) -> None:
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for name, proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in 10s; killing it", name)
                proc.kill()


def _targets_from_env() -> list[str] | None:
    for var in ("VLLM_TARGETS", names.ENV_TARGETS):
        raw = os.environ.get(var, "").strip()
        if raw:
            return [u.strip() for u in raw.split(",") if u.strip()]
    return None


def run_demo(args: argparse.Namespace) -> int:
    try:
        switch_at = parse_duration(args.switch_at)
        duration = parse_duration(args.duration) if args.duration else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if args.time_scale <= 0:
        raise ConfigError("--time-scale must be greater than 0")
    targets = args.vllm or _targets_from_env()
    sim = None
    requests_log = None
    log_dir: tempfile.TemporaryDirectory | None = None
    if not targets:
        # The simulator writes vLLM-format request log lines; the exporter follows them (the
        # request-level view behind prefix_divergence and routing_spread), as in compose.
        log_dir = tempfile.TemporaryDirectory(prefix="prefixwatch-requests-")
        log_path = str(Path(log_dir.name) / "requests.log")
        sim = build_simulation(simulation_args(
            replicas=args.replicas, scenario=args.scenario, switch_to=args.switch_to,
            switch_at=switch_at, rate=args.rate, port=args.sim_port, request_log=log_path))
        targets = sim.urls
        requests_log = {"path": log_path, "follow": True}
    config = build_config(targets=targets, listen_address=args.listen_address,
                          interval=max(0.5, names.DEFAULT_INTERVAL_SECONDS * args.time_scale),
                          diagnosis_window=rules.prom_duration(
                              parse_duration(causes.DIAGNOSIS_WINDOW) * args.time_scale),
                          cold_start=rules.prom_duration(
                              parse_duration(causes.COLD_START) * args.time_scale),
                          requests_log=requests_log)
    exporter = Exporter(config)
    backends: Backends | None = None
    tmpdir: tempfile.TemporaryDirectory | None = None
    try:
        try:
            exporter.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {args.listen_address}: {exc.strerror}") from exc
        prometheus, am_binary = _find(PROMETHEUS_BINARIES), _find(ALERTMANAGER_BINARIES)
        if args.no_prometheus:
            pass
        elif prometheus and am_binary:
            if args.data_dir:
                workdir = Path(args.data_dir)
            else:
                tmpdir = tempfile.TemporaryDirectory(prefix="prefixwatch-demo-")
                workdir = Path(tmpdir.name)
            backends = Backends(workdir, exporter.port, args.prometheus_port,
                                args.alertmanager_port, args.time_scale)
            backends.start(prometheus, am_binary)
        else:
            log.warning("Prometheus and Alertmanager are not installed, so no alert rules run "
                        "here; install them with: %s", INSTALL_HINT)
        if sim is not None:
            sim.start()
        print(_summary(args, sim, targets, exporter, backends), flush=True)
        wait_for_signal(duration)
    finally:
        if backends is not None:
            backends.stop()
        exporter.stop()
        if sim is not None:
            sim.stop()
        if tmpdir is not None:
            tmpdir.cleanup()
        if log_dir is not None:
            log_dir.cleanup()
    log.info("demo stopped")
    return 0


def _summary(args: argparse.Namespace, sim, targets: list[str], exporter: Exporter,
             backends: Backends | None) -> str:
    host = exporter.config.listen_host_port[0]
    lines = ["", "prefixwatch demo is running:"]
    if sim is not None:
        lines += [f"  simulated vLLM replica {i}: {url}" for i, url in enumerate(sim.urls)]
        lines.append(f"  workload: {args.scenario}, switching to {args.switch_to} after "
                     f"{args.switch_at}")
    else:
        lines += [f"  watching vLLM: {u}" for u in targets]
    lines.append(f"  exporter:      http://{host}:{exporter.port}/  (metrics at /metrics)")
    if backends is not None:
        lines.append(f"  Prometheus:    http://127.0.0.1:{backends.prom_port}/alerts")
        lines.append(f"  Alertmanager:  http://127.0.0.1:{backends.am_port}/  (pages go to "
                     f"${alertmanager.ENV_PAGER})")
        lines.append(f"  logs and data: {backends.workdir}")
    else:
        lines.append(f"  Prometheus/Alertmanager: not running ({INSTALL_HINT})")
    lines += ["  Grafana: not started (not in Debian's package sources); import "
              "dashboards/*.json into your Grafana, or use docker compose up",
              f"  try: prefixwatch status --target {targets[0]}",
              "  Ctrl-C stops everything.", ""]
    return "\n".join(lines)
