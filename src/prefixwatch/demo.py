"""`prefixwatch demo`: the docker-compose stack on one machine, without Docker.

Simulator (unless a vLLM is given), exporter, and, when their binaries are installed, a real
Prometheus and Alertmanager started from the same configuration as the compose stack (the
generated rules, alertmanager.yml rendered from the environment, prometheus.yml with loopback
addresses). Alertmanager also notifies a small webhook receiver inside the demo, which prints
each page and resolution in the terminal. Grafana is not in Debian's package sources, so it is
not started here: the dashboards are written into the demo's state directory for import.

``--time-scale`` compresses the whole story (switch time, cold start, diagnosis and rule
windows, Alertmanager timers) so that at 0.05 the page arrives within about a minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests
import yaml

from prefixwatch.core import causes, names
from prefixwatch.core.errors import ConfigError
from prefixwatch.core.ports import port_free, port_in_use_message
from prefixwatch.core.windows import parse_duration
from prefixwatch.exporter.config import build_config, split_host_port
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin import alertmanager, dashboards, rules, stack
from prefixwatch.simulator.cli import build_simulation, simulation_args, wait_for_signal

log = logging.getLogger("prefixwatch.demo")

PROMETHEUS_BINARIES = ("prometheus",)
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")
INSTALL_HINT = "apt-get install prometheus prometheus-alertmanager"
#: The regression lands a minute after the cold-start window, so that the page's diagnosis
#: names the prompt change, not a cold cache.
DEFAULT_SWITCH_AT = parse_duration(causes.COLD_START) + 60
#: The simulator's request log (about 300 MB an hour at 4 req/s) rotates at this size.
REQUEST_LOG_MAX_MB = 64
#: Where each UI page lives: Prometheus 2.x's React UI at /alerts, Debian's build (no React
#: assets) under /classic/.
PROMETHEUS_PAGES = {"alerts": ("/alerts", "/classic/alerts"),
                    "graph": ("/graph", "/classic/graph")}
READY_TIMEOUT = 30.0


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="run the whole stack on this machine, without Docker",
        description="Run the prefixwatch stack without Docker: simulator (or your vLLM), "
                    "exporter, and Prometheus and Alertmanager when installed, from the same "
                    "config as docker-compose.yml. With no --vllm, two simulated vLLM replicas "
                    "run a healthy chat workload that regresses after --switch-at (a timestamp "
                    "at the top of the system prompt); the page is printed here as it fires "
                    "and resolves, and also goes to $PREFIXWATCH_PAGER_WEBHOOK_URL if set.",
        epilog="Example: prefixwatch demo --time-scale 0.05   (the page within about a minute)")
    p.add_argument("--vllm", action="append", metavar="URL",
                   help="watch this vLLM /metrics URL instead of the simulator; repeat "
                        "(default: $VLLM_TARGETS or $PREFIXWATCH_TARGETS if set)")
    p.add_argument("--replicas", type=int, default=2, help="simulated replicas (default 2)")
    p.add_argument("--scenario", default="static-system-prompt",
                   help="workload before the switch (default static-system-prompt)")
    p.add_argument("--switch-to", default="timestamp-at-top",
                   help="workload after the switch (default timestamp-at-top)")
    p.add_argument("--switch-at", metavar="DURATION",
                   help=f"when the regression lands, scaled by --time-scale (default "
                        f"{rules.prom_duration(DEFAULT_SWITCH_AT)}: a minute after the "
                        f"{causes.COLD_START} cold start)")
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
                   help="keep the demo's state here: request log, dashboards, Prometheus and "
                        "Alertmanager data and logs (default: a temporary directory removed "
                        "on exit)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="FACTOR",
                   help="compress every duration of the story by FACTOR: switch time, cold "
                        "start, diagnosis and rule windows, `for:`, scrape intervals and "
                        "Alertmanager timers (0.05: the page within about a minute); "
                        "1 = real time")
    p.add_argument("--duration", metavar="DURATION",
                   help="stop after this long, in wall-clock time (not scaled)")
    p.add_argument("--report-on-exit", action="store_true",
                   help="write the incident report of the run (prefixwatch report) when "
                        "--duration ends too, not only on Ctrl-C")


def _find(binaries: tuple[str, ...]) -> str | None:
    for name in binaries:
        path = shutil.which(name)
        if path:
            return path
    return None


def _scaled(duration: str | float, scale: float) -> str:
    seconds = parse_duration(duration) if isinstance(duration, str) else duration
    return rules.prom_duration(seconds * scale)


# -- notifications ------------------------------------------------------------------------------

def _diagnosis(description: str) -> str:
    """The ``Diagnosis: ...`` clause the alert rules append to each description."""
    _, sep, diagnosis = description.partition(" Diagnosis: ")
    return diagnosis.strip() if sep else "-"


def format_notification(alert: dict[str, Any]) -> list[str]:
    """A firing or resolved alert as the terminal shows it: what, the diagnosis, the runbook."""
    labels, notes = alert.get("labels", {}), alert.get("annotations", {})
    severity = labels.get("severity", "")
    if alert.get("status") == "resolved":
        head = "RESOLVED"
    else:
        head = {"critical": "PAGE", "warning": "TICKET"}.get(severity, "ALERT")
    model = labels.get("model_name")
    lines = [f"[{time.strftime('%H:%M:%S')}] {head}: {labels.get('alertname', '?')} "
             f"({severity or 'no severity'}{', model ' + model if model else ''}) "
             f"{notes.get('summary', '')}".rstrip()]
    if alert.get("status") != "resolved":
        lines.append(f"    diagnosis: {_diagnosis(notes.get('description', ''))}")
    if notes.get("runbook_url"):
        lines.append(f"    runbook:   {notes['runbook_url']}")
    return lines


class NotificationPrinter:
    """Alertmanager's webhook receiver inside the demo: prints each page and resolution once
    (Alertmanager repeats them) and lists the recent ones on GET /."""

    MAX_BODY = 1 << 20
    KEEP = 50

    def __init__(self, out=None) -> None:
        self.out = out or sys.stdout
        self.recent: deque[str] = deque(maxlen=self.KEEP)
        self.pages = 0
        self._seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        printer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                text = "\n".join(printer.recent) or "no page or resolution yet"
                self._answer(200, (text + "\n").encode())

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= printer.MAX_BODY:
                    self._answer(413 if length else 400)
                    return
                try:
                    message = json.loads(self.rfile.read(length))
                except ValueError:
                    self._answer(400)
                    return
                printer.receive(message)
                self._answer(200)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="notifications",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def receive(self, message: Any) -> None:
        alerts = message.get("alerts") if isinstance(message, dict) else None
        for alert in alerts if isinstance(alerts, list) else []:
            if not isinstance(alert, dict):
                continue
            labels = alert.get("labels") or {}
            if labels.get("alertname") == rules.ALERT_WATCHDOG:
                continue
            key = (str(alert.get("fingerprint")), str(alert.get("status")),
                   str(alert.get("startsAt")))
            with self._lock:
                if key in self._seen:
                    continue
                if len(self._seen) > 10_000:
                    self._seen.clear()
                self._seen.add(key)
                lines = format_notification(alert)
                if alert.get("status") != "resolved" and labels.get("severity") == "critical":
                    self.pages += 1
                self.recent.extend(lines)
                # A closed terminal (the demo is stopping) must not break the receiver.
                with contextlib.suppress(BrokenPipeError, ValueError):
                    print("\n".join(lines), file=self.out, flush=True)

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def alertmanager_config(receiver_url: str, scale: float) -> dict[str, Any]:
    """The stack's routing with the demo's receiver beside the user's webhooks (and instead
    of the ``.invalid`` placeholders when none is set); the Watchdog is left alone."""
    cfg = alertmanager.config(time_scale=scale)
    placeholders = set(alertmanager.DEFAULT_URLS.values())
    for receiver in cfg.get("receivers", []):
        if receiver.get("name") == "watchdog":
            continue
        hooks = [h for h in receiver.get("webhook_configs", []) if h.get("url") not in
                 placeholders]
        receiver["webhook_configs"] = [*hooks, {"url": receiver_url, "send_resolved": True}]
    return cfg


# -- Prometheus and Alertmanager ----------------------------------------------------------------

def _last_log_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                 if ln.strip()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if "level=error" in ln or "err=" in ln]
    return (errors or lines or ["empty log"])[-1][:300]


class Backends:
    """Prometheus and Alertmanager as child processes, with the stack's configuration.
    ``stop`` is safe at any point of a failed ``start``."""

    def __init__(self, workdir: Path, exporter_port: int, prom_port: int, am_port: int,
                 time_scale: float) -> None:
        self.workdir = workdir
        self.procs: list[tuple[str, subprocess.Popen, Any]] = []
        self.prom_port, self.am_port = prom_port, am_port
        self.scale = time_scale
        self.exporter_port = exporter_port
        self.pages: dict[str, str] = {}

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prom_port}"

    def start(self, prometheus: str, am_binary: str, receiver_url: str) -> None:
        rules_dir = self.workdir / "rules"
        rules_dir.mkdir(parents=True, exist_ok=True)
        (rules_dir / "prefixwatch.exporter.rules.yml").write_text(
            rules.render("exporter", rules.RulesConfig(time_scale=self.scale)))
        (self.workdir / "alertmanager.yml").write_text(
            "# Generated by `prefixwatch demo`: the stack's routing plus the demo's receiver.\n"
            + yaml.safe_dump(alertmanager_config(receiver_url, self.scale), sort_keys=False))
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
        self.pages = {page: self._ui_path(candidates)
                      for page, candidates in PROMETHEUS_PAGES.items()}

    def _ui_path(self, candidates: tuple[str, ...]) -> str:
        """The first of the candidate paths this Prometheus answers with 200 (the UI moved
        between versions and Debian's build serves only the classic one)."""
        for path in candidates:
            with contextlib.suppress(requests.RequestException):
                resp = requests.get(self.prometheus_url + path, timeout=5, allow_redirects=False)
                if resp.status_code == 200:
                    return path
        return "/"

    def _spawn(self, name: str, argv: list[str], log_path: Path) -> None:
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        try:
            proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        except OSError as exc:
            log_file.close()
            raise ConfigError(f"cannot start {name} ({argv[0]}): {exc.strerror}") from exc
        self.procs.append((name, proc, log_file))

    def _wait_ready(self, name: str, url: str, log_path: Path) -> None:
        proc = next(p for n, p, _ in self.procs if n == name)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ConfigError(f"{name} exited with status {proc.returncode}: "
                                  f"{_last_log_line(log_path)} (log: {log_path})")
            with contextlib.suppress(requests.RequestException):
                if requests.get(url, timeout=1).status_code == 200:
                    return
            time.sleep(0.2)
        raise ConfigError(f"{name} did not become ready within {READY_TIMEOUT:g}s "
                          f"(log: {log_path})")

    def stop(self) -> None:
        for _name, proc, _f in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for name, proc, log_file in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in 10s; killing it", name)
                proc.kill()
                proc.wait(timeout=5)
            log_file.close()
        self.procs.clear()


# -- the demo -----------------------------------------------------------------------------------

def _targets_from_env() -> list[str] | None:
    for var in ("VLLM_TARGETS", names.ENV_TARGETS):
        raw = os.environ.get(var, "").strip()
        if raw:
            return [u.strip() for u in raw.split(",") if u.strip()]
    return None


def _check_ports(args: argparse.Namespace, simulate: bool, backends: bool) -> None:
    """Every fixed port the demo will bind, checked as the servers bind (SO_REUSEADDR, so a
    previous run's TIME_WAIT does not count), before anything starts."""
    wanted: list[tuple[str, int, str, str]] = []
    if simulate and args.sim_port:
        wanted += [("127.0.0.1", args.sim_port + i, f"simulated replica {i}", "--sim-port")
                   for i in range(args.replicas)]
    host, port = split_host_port(args.listen_address)
    if port:
        wanted.append((host, port, "the exporter", "--listen-address"))
    if backends:
        wanted += [("127.0.0.1", args.prometheus_port, "Prometheus", "--prometheus-port"),
                   ("127.0.0.1", args.alertmanager_port, "Alertmanager", "--alertmanager-port")]
    for host, port, what, flag in wanted:
        if not 0 < port < 65536:
            raise ConfigError(f"{flag}: port {port} is out of range")
        if not port_free(port, host):
            raise ConfigError(port_in_use_message(port, what, flag, host))


def _validate(args: argparse.Namespace) -> tuple[float, float | None]:
    if args.time_scale <= 0:
        raise ConfigError("--time-scale must be greater than 0")
    try:
        switch_at = parse_duration(args.switch_at) if args.switch_at else DEFAULT_SWITCH_AT
        duration = parse_duration(args.duration) if args.duration else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if not 1 <= args.replicas <= 64:
        raise ConfigError("--replicas must be between 1 and 64")
    return switch_at * args.time_scale, duration


def run_demo(args: argparse.Namespace) -> int:
    switch_at, duration = _validate(args)
    scale = args.time_scale
    targets = args.vllm or _targets_from_env()
    binaries = (_find(PROMETHEUS_BINARIES), _find(ALERTMANAGER_BINARIES))
    with_backends = not args.no_prometheus and all(binaries)
    if not args.no_prometheus and not with_backends:
        log.warning("Prometheus and Alertmanager are not installed, so no alert rules run "
                    "here; install them with: %s", INSTALL_HINT)
    _check_ports(args, simulate=not targets, backends=with_backends)
    with contextlib.ExitStack() as cleanup:
        if args.data_dir:
            state = Path(args.data_dir)
            state.mkdir(parents=True, exist_ok=True)
        else:
            tmp = tempfile.TemporaryDirectory(prefix="prefixwatch-demo-")
            cleanup.callback(tmp.cleanup)
            state = Path(tmp.name)
        dashboards_dir = state / "dashboards"
        dashboards.write(dashboards_dir, "exporter", None)
        sim = None
        requests_log = None
        if not targets:
            # The simulator writes vLLM-format request log lines; the exporter follows them
            # (the request-level view behind prefix_divergence and routing_spread).
            log_path = str(state / "requests.log")
            sim = build_simulation(simulation_args(
                replicas=args.replicas, scenario=args.scenario, switch_to=args.switch_to,
                switch_at=switch_at, rate=args.rate, port=args.sim_port, request_log=log_path,
                request_log_max_mb=REQUEST_LOG_MAX_MB))
            cleanup.callback(sim.stop)
            targets = sim.urls
            requests_log = {"path": log_path, "follow": True}
        config = build_config(
            targets=targets, listen_address=args.listen_address,
            interval=max(0.5, names.DEFAULT_INTERVAL_SECONDS * scale),
            windows=[_scaled(w, scale) for w in names.DEFAULT_WINDOWS] if scale != 1 else None,
            diagnosis_window=_scaled(causes.DIAGNOSIS_WINDOW, scale),
            cold_start=_scaled(causes.COLD_START, scale), requests_log=requests_log)
        exporter = Exporter(config)
        if sim is not None:
            sim.start()
        try:
            exporter.start()
        except OSError as exc:
            host, port = config.listen_host_port
            raise ConfigError(port_in_use_message(port, "the exporter", "--listen-address", host)
                              if not port_free(port, host) else
                              f"cannot listen on {args.listen_address}: {exc.strerror}") from exc
        cleanup.callback(exporter.stop)
        backends = printer = None
        if with_backends:
            printer = NotificationPrinter()
            cleanup.callback(printer.stop)
            backends = Backends(state, exporter.port, args.prometheus_port,
                                args.alertmanager_port, scale)
            cleanup.callback(backends.stop)
            backends.start(binaries[0], binaries[1], printer.url)  # type: ignore[arg-type]
        print(_summary(args, sim, targets, exporter, backends, printer, state, switch_at),
              flush=True)
        began, began_mono = time.time(), time.monotonic()
        wait_for_signal(duration)
        interrupted = duration is None or time.monotonic() - began_mono < duration - 0.5
        if backends is not None and (interrupted or args.report_on_exit):
            _write_report(backends.prometheus_url, began)
    log.info("demo stopped")
    return 0


def _write_report(prometheus: str, began: float) -> None:
    """The run's incident report (issue 15), before Prometheus stops; never fails the exit."""
    from prefixwatch.core.errors import PrefixwatchError
    from prefixwatch.report import Request, write_report

    out = Path.cwd() / time.strftime("prefixwatch-report-%Y%m%d-%H%M%S")
    try:
        written = write_report(prometheus, out, Request(
            began, time.time(), names.DEFAULT_HIT_RATIO_THRESHOLD))
    except PrefixwatchError as exc:
        log.warning("no incident report: %s", exc)
        return
    print(f"incident report of this run: {written.html}", flush=True)


def _summary(args: argparse.Namespace, sim, targets: list[str], exporter: Exporter,
             backends: Backends | None, printer: NotificationPrinter | None, state: Path,
             switch_at: float) -> str:
    host = exporter.config.listen_host_port[0]
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    scale = args.time_scale
    lines = ["", "prefixwatch demo is running:"]
    if sim is not None:
        lines += [f"  simulated vLLM replica {i}: {url}" for i, url in enumerate(sim.urls)]
        at = time.strftime("%H:%M:%S", time.localtime(time.time() + switch_at))
        lines.append(f"  workload: {args.scenario}, switching to {args.switch_to} at {at} "
                     f"(in {switch_at:.0f}s)")
    else:
        lines += [f"  watching vLLM: {u}" for u in targets]
    lines.append(f"  exporter:      http://{host}:{exporter.port}/  (metrics at /metrics)")
    if backends is not None and printer is not None:
        prom = backends.prometheus_url
        ratio = quote(rules.r_ratio(rules.MODEL, "1m"))
        lines += [f"  Prometheus:    {prom}{backends.pages['alerts']}",
                  f"  hit rate:      {prom}{backends.pages['graph']}?g0.expr={ratio}&g0.tab=0",
                  f"  Alertmanager:  http://127.0.0.1:{backends.am_port}/#/alerts",
                  f"  pages:         printed below as they fire and resolve (also listed at "
                  f"{printer.url}), and sent to ${alertmanager.ENV_PAGER} if set"]
    elif args.no_prometheus:
        lines.append("  Prometheus/Alertmanager: not started (--no-prometheus)")
    else:
        lines.append(f"  Prometheus/Alertmanager: not installed ({INSTALL_HINT})")
    cold = _scaled(causes.COLD_START, scale)
    lines += [f"  Grafana: not started (not in Debian's package sources); import "
              f"{state / 'dashboards'}/*.json into your Grafana, or use docker compose up; "
              f"meanwhile http://{host}:{exporter.port}/ charts the hit ratio and TTFT",
              f"  state:         {state}" + ("" if args.data_dir else " (removed on exit; "
                                                                       "--data-dir keeps it)"),
              f"  try: prefixwatch status --target {targets[0]} --cold-start {cold}",
              "  Ctrl-C stops everything.", ""]
    return "\n".join(lines)
