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
import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import yaml

from prefixwatch.core import cliargs
from prefixwatch.core.errors import ConfigError
from prefixwatch.core.ports import port_free, port_in_use_message
from prefixwatch.core.vocab import causes, exposition, rulenames, settings
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.demo.backends import (
    ALERTMANAGER_API,
    ALERTMANAGER_BINARIES,
    DEFAULT_SWITCH_AT,
    INSTALL_HINT,
    PROMETHEUS_BINARIES,
    REQUEST_LOG_MAX_MB,
    Backends,
    find_binary,
    scaled,
)
from prefixwatch.demo.pager import NotificationPrinter
from prefixwatch.demo.routers import BINARIES as router_binaries
from prefixwatch.demo.routers import RoutedWorkload, install_hint
from prefixwatch.demo.shutdown import Shutdown, Skipped, skippable
from prefixwatch.exporter.config import ConfigFlags, build_config, split_host_port
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin import alertmanager, dashboards
from prefixwatch.mixin import config as mixin_config
from prefixwatch.simulator.cli import build_simulation, simulation_args, wait_for_signal

log = logging.getLogger("prefixwatch.demo")

#: Seconds before the shutdown's deadline at which Prometheus or Alertmanager, still running,
#: is killed.
KILL_MARGIN = 0.25
#: The range of --time-scale: below it the scaled timers (a 15 s scrape, a 30 s group wait)
#: fall under the millisecond Prometheus counts in; above it the story takes days.
MIN_TIME_SCALE = 0.01
MAX_TIME_SCALE = 10.0


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="start here: the whole stack on this machine, without Docker",
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
    p.add_argument("--replicas", type=cliargs.count, default=2, metavar="N",
                   help="simulated replicas (default 2)")
    p.add_argument("--engine", choices=["vllm", "sglang"], default="vllm",
                   help="what the simulated replicas stand in for: vLLM or SGLang (its radix "
                        "cache, /metrics and KV events) (default vllm)")
    p.add_argument("--page-size", type=cliargs.count, default=1, metavar="N",
                   help="with --engine sglang: SGLang's --page-size (default 1)")
    p.add_argument("--scenario", metavar="NAME",
                   help="workload before the switch (default static-system-prompt; with "
                        "--router, prefix-affinity)")
    p.add_argument("--switch-to", default="timestamp-at-top", metavar="NAME",
                   help="workload after the switch (default timestamp-at-top)")
    p.add_argument("--switch-at", metavar="DURATION", type=cliargs.duration,
                   help=f"when the regression lands, scaled by --time-scale (default "
                        f"{mixin_config.prom_duration(DEFAULT_SWITCH_AT)}: a minute after the "
                        f"{causes.COLD_START} cold start)")
    p.add_argument("--rate", type=cliargs.positive_factor, default=4.0, metavar="REQ_PER_S",
                   help="requests per second (default 4)")
    p.add_argument("--sim-port", type=cliargs.port, default=8000, metavar="PORT",
                   help="first simulator port (default 8000; 0 = any free port)")
    p.add_argument("--listen-address", default=f"127.0.0.1:{exposition.DEFAULT_PORT}",
                   metavar="HOST:PORT",
                   help=f"exporter address (default 127.0.0.1:{exposition.DEFAULT_PORT})")
    p.add_argument("--prometheus-port", type=cliargs.port, default=9090, metavar="PORT",
                   help="Prometheus port on 127.0.0.1 (default 9090)")
    p.add_argument("--alertmanager-port", type=cliargs.port, default=9093, metavar="PORT",
                   help="Alertmanager port on 127.0.0.1 (default 9093)")
    p.add_argument("--no-prometheus", action="store_true",
                   help="do not start Prometheus and Alertmanager even when installed")
    p.add_argument("--data-dir", metavar="DIR",
                   help="keep the demo's state here: request log, dashboards, Prometheus and "
                        "Alertmanager data and logs (default: a temporary directory removed "
                        "on exit)")
    p.add_argument("--time-scale", type=time_scale, default=1.0, metavar="FACTOR",
                   help="compress every duration of the story by FACTOR: switch time, cold "
                        "start, diagnosis and rule windows, `for:`, scrape intervals and "
                        "Alertmanager timers (0.05: the page within about a minute); "
                        f"1 = real time; {MIN_TIME_SCALE:g} to {MAX_TIME_SCALE:g}")
    p.add_argument("--duration", metavar="DURATION", type=cliargs.duration,
                   help="stop after this long, in wall-clock time (not scaled), e.g. 10m or "
                        "600 (seconds)")
    p.add_argument("--router", choices=tuple(router_binaries), metavar="KIND",
                   help="put a real router (vllm-router or smg: pip install "
                        "'prefixwatch[routers]') between the workload and the simulated "
                        "replicas, with the prefix-aware policy; at --switch-at routing "
                        "degrades: the router is restarted with round_robin (the workload "
                        "defaults to prefix-affinity's 24 tenants)")
    p.add_argument("--router-policy", metavar="POLICY",
                   help="the router's policy before the switch (default: vllm-router "
                        "kv_aware, smg prefix_hash)")
    p.add_argument("--report-on-exit", action="store_true",
                   help="write the incident report of the run (prefixwatch report) when "
                        "--duration ends too, not only on Ctrl-C")


def _targets_from_env() -> list[str] | None:
    for var in ("VLLM_TARGETS", exposition.ENV_TARGETS):
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


def time_scale(text: str) -> float:
    """argparse type of --time-scale: a finite factor the scaled windows survive (below
    MIN_TIME_SCALE a second-long timer would round to nothing)."""
    value = cliargs.positive_factor(text)
    if not MIN_TIME_SCALE <= value <= MAX_TIME_SCALE:
        raise argparse.ArgumentTypeError(
            f"{text!r} is out of range ({MIN_TIME_SCALE:g} to {MAX_TIME_SCALE:g}; 0.05 puts "
            "the page within about a minute)")
    return value


def _validate(args: argparse.Namespace) -> tuple[float, float | None]:
    switch_at = args.switch_at if args.switch_at else DEFAULT_SWITCH_AT
    if not 1 <= args.replicas <= 64:
        raise ConfigError("--replicas must be between 1 and 64")
    return switch_at * args.time_scale, args.duration


def run_demo(args: argparse.Namespace) -> int:
    switch_at, duration = _validate(args)
    scale = args.time_scale
    targets = args.vllm or _targets_from_env()
    binaries = (find_binary(PROMETHEUS_BINARIES), find_binary(ALERTMANAGER_BINARIES))
    with_backends = not args.no_prometheus and all(binaries)
    if not args.no_prometheus and not with_backends:
        log.warning("Prometheus and Alertmanager are not installed, so no alert rules run "
                    "here; install them with: %s", INSTALL_HINT)
    _check_ports(args, simulate=not targets, backends=with_backends)
    _check_router(args, targets)
    with contextlib.ExitStack() as cleanup:
        if args.data_dir:
            state = Path(args.data_dir)
            state.mkdir(parents=True, exist_ok=True)
        else:
            tmp = tempfile.TemporaryDirectory(prefix="prefixwatch-demo-",
                                              ignore_cleanup_errors=True)
            cleanup.callback(tmp.cleanup)
            state = Path(tmp.name)
        parts = Shutdown()
        cleanup.callback(parts.stop_all)
        dashboards_dir = state / "dashboards"
        dashboards.write(dashboards_dir, "exporter", None)
        sim = None
        requests_log = None
        if not targets:
            # The simulator writes vLLM-format request log lines; the exporter follows them
            # (the request-level view behind prefix_divergence and routing_spread).
            log_path = str(state / "requests.log")
            # Each replica also publishes vLLM's KV event stream (on a free port), and the
            # exporter subscribes to it: the "why these tokens were computed" ledger.
            routed = args.router is not None
            sim = build_simulation(simulation_args(
                replicas=args.replicas, scenario=_scenario(args),
                switch_to=None if routed else args.switch_to,
                switch_at=None if routed else switch_at, rate=0 if routed else args.rate,
                port=args.sim_port, request_log=log_path,
                request_log_max_mb=REQUEST_LOG_MAX_MB, kv_events_port=0,
                engine=args.engine, page_size=args.page_size))
            parts.add("the simulator", sim.stop, after="the exporter")
            targets = sim.urls
            requests_log = {"path": log_path, "follow": True}
        routed_workload = _routed(args, sim, state, switch_at, parts)
        config = build_config(ConfigFlags(
            targets=_with_kv_events(targets, sim) + (
                [{"url": routed_workload.spec.metrics_url, "name": "router", "kind": "router"}]
                if routed_workload else []), listen_address=args.listen_address,
            interval=max(0.5, exposition.DEFAULT_INTERVAL_SECONDS * scale),
            windows=story_windows(scale),
            diagnosis_window=diagnosis_window(scale),
            cold_start=scaled(causes.COLD_START, scale), requests_log=requests_log))
        config = replace(config, thresholds=replace(
            config.thresholds, min_requests=min_requests(config.thresholds, scale)))
        exporter = Exporter(config)
        if sim is not None:
            sim.start()
        if routed_workload is not None:
            _start_routed(args, routed_workload, switch_at)
        try:
            exporter.start()
        except OSError as exc:
            host, port = config.listen_host_port
            raise ConfigError(port_in_use_message(port, "the exporter", "--listen-address", host)
                              if not port_free(port, host) else
                              f"cannot listen on {args.listen_address}: {exc.strerror}") from exc
        parts.add("the exporter", exporter.stop)
        backends = printer = None
        if with_backends:
            printer = NotificationPrinter(
                alertmanager_url=f"http://127.0.0.1:{args.alertmanager_port}")
            parts.add("the page printer", printer.stop)
            backends = Backends(state, exporter.port, args.prometheus_port,
                                args.alertmanager_port, scale)
            # Killed a little before the shared deadline, so that no child outlives the demo.
            parts.add_with_deadline("Prometheus and Alertmanager",
                                    lambda deadline: backends.stop(deadline - KILL_MARGIN))
            backends.start(binaries[0], binaries[1], printer.url)  # type: ignore[arg-type]
        status_file = _write_status_config(state, _with_kv_events(targets, sim), scale,
                                           requests_log)
        print(_summary(args, sim, targets, exporter, backends, printer, state, switch_at,
                       status_file, routed_workload), flush=True)
        began = time.time()
        received = wait_for_signal(duration)
        # Ctrl-C is someone at the terminal who wants the run's report; SIGTERM is a
        # supervisor that wants the process gone within 2 s.
        if backends is not None and (received == signal.SIGINT or (
                received is None and args.report_on_exit)):
            _write_report(backends.prometheus_url, began, args.time_scale)
        elif backends is not None and received == signal.SIGTERM:
            log.info("SIGTERM: stopping without the incident report (Ctrl-C writes one)")
    log.info("demo stopped")
    return 0


def _check_router(args: argparse.Namespace, targets: list[str] | None) -> None:
    """--router needs the simulated replicas and the router's binary (or says how to get it)."""
    if not args.router:
        return
    if targets:
        raise ConfigError("--router puts a router in front of the simulated replicas; it "
                          "cannot be combined with --vllm")
    hint = install_hint(args.router)
    if hint:
        raise ConfigError(hint)


def _routed(args: argparse.Namespace, sim, state: Path, switch_at: float,  # noqa: ANN001
            parts: Shutdown) -> RoutedWorkload | None:
    """With --router (and the simulator): the workload through the real router, stopped
    with the demo's other parts."""
    if sim is None or not args.router:
        return None
    from prefixwatch.simulator.driver import get_scenario

    routed = RoutedWorkload(args.router, args.router_policy, sim,
                            get_scenario(_scenario(args)), args.rate, state, switch_at)
    parts.add("the router", routed.stop, after="the exporter")
    return routed


def _start_routed(args: argparse.Namespace, routed: RoutedWorkload, switch_at: float) -> None:
    try:
        routed.start()
    except (RuntimeError, OSError) as exc:
        raise ConfigError(f"{args.router} did not start: {exc}") from exc
    log.info("workload %s at %g req/s through %s (%s) at %s; routing degrades (round_robin) "
             "after %gs", _scenario(args), args.rate, args.router, routed.spec.policy,
             routed.spec.url, switch_at)


def _scenario(args: argparse.Namespace) -> str:
    """The workload: the one asked for; with a router, 24 tenants (prefix-affinity's)."""
    if args.scenario:
        return args.scenario
    return "prefix-affinity" if args.router else "static-system-prompt"


def story_windows(scale: float) -> list[str]:
    """The exporter's windows: the paging window first (the landing page's headline reads
    the first, so it names the ratio and window the page names), then the defaults; all
    scaled."""
    wanted = [settings.CRITICAL_SHORT_WINDOW, *exposition.DEFAULT_WINDOWS]
    return list(dict.fromkeys(scaled(w, scale) for w in wanted))


def diagnosis_window(scale: float) -> str:
    """The demo's diagnosis window: under a time scale, twice the paging window (enough
    requests not to flap, short enough that the cause is known when the compressed page
    fires); at 1, the exporter's default."""
    if scale == 1:
        return causes.DIAGNOSIS_WINDOW
    return scaled(min(parse_duration(causes.DIAGNOSIS_WINDOW),
                      2 * parse_duration(settings.CRITICAL_SHORT_WINDOW)), scale)


def min_requests(thresholds: causes.DiagnosisThresholds, scale: float) -> int:
    """The requests a diagnosis needs: a time scale compresses the windows, not the traffic,
    so a scaled window holds that many times fewer requests (at least 5)."""
    return thresholds.min_requests if scale >= 1 else max(
        5, min(thresholds.min_requests, round(thresholds.min_requests * scale * 5)))


def _write_status_config(state: Path, targets: list, scale: float,
                         requests_log: dict | None) -> Path:
    """A config for `prefixwatch status` that sees what the demo's exporter sees: every
    replica with its KV event stream, the request log, and the diagnosis' scaled windows."""
    path = state / "status.yml"
    extra = ({"requests_log": {"path": requests_log["path"], "follow": True}}
             if requests_log else {})
    path.write_text(
        "# Written by `prefixwatch demo`: `prefixwatch status --config` this file sees what "
        "the demo's exporter sees.\n" + yaml.safe_dump({
            "targets": [t if isinstance(t, dict) else {"url": t} for t in targets],
            settings.DIAGNOSIS_KEY: {
                "window": diagnosis_window(scale), "cold_start": scaled(causes.COLD_START, scale),
                "min_requests": min_requests(causes.DiagnosisThresholds(), scale)},
            **extra},
            sort_keys=False))
    return path


def _with_kv_events(targets: list[str], sim) -> list:  # noqa: ANN001 - a Simulation or None
    """The exporter's targets: each simulated replica's /metrics URL with its KV event
    endpoint (the per-target ``kv_events`` key), or the URLs alone (a vLLM given with --vllm)."""
    endpoints = sim.kv_events_endpoints if sim is not None else []
    if not endpoints:
        return list(targets)
    return [{"url": url, "kv_events": endpoint}
            for url, endpoint in zip(targets, endpoints, strict=True)]


def _write_report(prometheus: str, began: float, time_scale: float) -> None:
    """The run's incident report, on the rules' clock, before Prometheus stops; never fails
    the exit."""
    from prefixwatch.core.errors import PrefixwatchError
    from prefixwatch.report import Request, write_report

    out = Path.cwd() / time.strftime("prefixwatch-report-%Y%m%d-%H%M%S")
    # On the terminal whatever the log level: the person who pressed Ctrl-C waits for it.
    print("writing the incident report of this run (Ctrl-C again skips it) ...", flush=True)
    try:
        with skippable():
            written = write_report(prometheus, out, Request(
                began, time.time(), exposition.DEFAULT_HIT_RATIO_THRESHOLD, time_scale=time_scale))
    except PrefixwatchError as exc:
        log.warning("no incident report: %s", exc)
        return
    except Skipped as exc:
        shutil.rmtree(out, ignore_errors=True)  # a half-written report is no report
        log.warning("%s: incident report skipped", exc)
        return
    print(f"incident report of this run: {written.html}", flush=True)


#: The story's span at time scale 1: the healthy start, the switch, the page and a while
#: after it; the hit-rate link opens on this range (scaled), so the drop fills the graph.
STORY_SPAN = DEFAULT_SWITCH_AT * 2


def graph_link(graph_page: str, scale: float) -> str:
    """Prometheus' graph of the ratio that pages (the critical alert's short window) over the
    story's range, not the UI's default hour."""
    ratio = quote(rulenames.r_ratio(rulenames.MODEL, settings.CRITICAL_SHORT_WINDOW))
    span = mixin_config.prom_duration(max(120.0, round(STORY_SPAN * scale / 60) * 60))
    return f"{graph_page}?g0.expr={ratio}&g0.tab=0&g0.range_input={span}"


def _summary(args: argparse.Namespace, sim, targets: list[str], exporter: Exporter,
             backends: Backends | None, printer: NotificationPrinter | None, state: Path,
             switch_at: float, status_file: Path,
             routed: RoutedWorkload | None = None) -> str:
    host = exporter.config.listen_host_port[0]
    host = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    scale = args.time_scale
    lines = ["", "prefixwatch demo is running:"]
    if sim is not None:
        engine = "SGLang" if args.engine == "sglang" else "vLLM"
        lines += [f"  simulated {engine} replica {i}: {url}" for i, url in enumerate(sim.urls)]
        lines += [f"  KV events of replica {i}: {endpoint}"
                  for i, endpoint in enumerate(sim.kv_events_endpoints)]
        at = time.strftime("%H:%M:%S", time.localtime(time.time() + switch_at))
        if args.router:
            lines.append(f"  workload: {_scenario(args)} through {args.router}, routing "
                         f"degrades (round_robin) at {at} (in {switch_at:.0f}s)")
        else:
            lines.append(f"  workload: {_scenario(args)}, switching to {args.switch_to} at "
                         f"{at} (in {switch_at:.0f}s)")
    else:
        lines += [f"  watching vLLM: {u}" for u in targets]
    if routed is not None:
        lines.append(f"  router:        {args.router} ({routed.spec.policy}) at {routed.spec.url}, "
                     f"its metrics at {routed.spec.metrics_url}")
    lines.append(f"  exporter:      http://{host}:{exporter.port}/  (metrics at /metrics)")
    if backends is not None and printer is not None:
        prom = backends.prometheus_url
        am_page = backends.pages["alertmanager"]
        lines += [f"  Prometheus:    {prom}{backends.pages['alerts']}",
                  f"  hit rate:      {graph_link(prom + backends.pages['graph'], scale)}",
                  f"  Alertmanager:  {backends.alertmanager_url}{am_page}"
                  + ("  (its API: this build has no web UI)"
                     if am_page == ALERTMANAGER_API else ""),
                  f"  pages:         printed below as they fire and resolve, listed at "
                  f"{printer.url}, and sent to ${alertmanager.ENV_PAGER} if set"]
    elif args.no_prometheus:
        lines.append("  Prometheus/Alertmanager: not started (--no-prometheus)")
    else:
        lines.append(f"  Prometheus/Alertmanager: not installed ({INSTALL_HINT})")
    gap = scaled(settings.CRITICAL_SHORT_WINDOW, scale)  # the window the page names
    lines += [f"  Grafana: not started (not in Debian's package sources); import "
              f"{state / 'dashboards'}/*.json into your Grafana, or use docker compose up; "
              f"meanwhile http://{host}:{exporter.port}/ charts the hit ratio and TTFT",
              f"  state:         {state}" + ("" if args.data_dir else " (removed on exit; "
                                                                       "--data-dir keeps it)"),
              f"  try: prefixwatch status --config {status_file} --gap {gap}",
              "  Ctrl-C stops everything.", ""]
    return "\n".join(lines)
