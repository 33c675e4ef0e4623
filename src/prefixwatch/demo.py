"""`prefixwatch demo`: the whole thing on one machine, without Docker.

With no vLLM given, two simulated replicas serve a healthy workload that regresses after a few
minutes (a timestamp lands at the top of the system prompt), and the exporter watches them, so
a newcomer sees the hit rate fall without a GPU.
"""

from __future__ import annotations

import argparse
import logging

from . import catalog
from .config import build_config
from .exporter import Exporter
from .simulator.cli import build_simulation, simulation_args, wait_for_signal
from .windows import parse_duration

log = logging.getLogger("prefixwatch.demo")


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo", help="run simulator + exporter on this machine (no Docker needed)",
        description="Run the prefixwatch stack without Docker. With no --vllm, two simulated "
                    "vLLM replicas run a healthy chat workload that regresses after "
                    "--switch-at (a timestamp at the top of the system prompt).")
    p.add_argument("--vllm", action="append", metavar="URL",
                   help="watch this vLLM /metrics URL instead of the simulator; repeat "
                        f"(default: ${catalog.ENV_TARGETS} if set)")
    p.add_argument("--replicas", type=int, default=2, help="simulated replicas (default 2)")
    p.add_argument("--scenario", default="static-system-prompt",
                   help="workload before the switch (default static-system-prompt)")
    p.add_argument("--switch-to", default="timestamp-at-top",
                   help="workload after the switch (default timestamp-at-top)")
    p.add_argument("--switch-at", default="5m", metavar="DURATION",
                   help="when the regression lands (default 5m)")
    p.add_argument("--rate", type=float, default=4.0, help="requests per second (default 4)")
    p.add_argument("--sim-port", type=int, default=8000,
                   help="first simulator port (default 8000)")
    p.add_argument("--listen-address", default=f"127.0.0.1:{catalog.DEFAULT_PORT}",
                   help=f"exporter address (default 127.0.0.1:{catalog.DEFAULT_PORT})")
    p.add_argument("--interval", type=float, default=catalog.DEFAULT_INTERVAL_SECONDS,
                   help="exporter poll interval in seconds")
    p.add_argument("--duration", metavar="DURATION", help="stop after this long")


def run_demo(args: argparse.Namespace) -> int:
    from .config import ConfigError

    try:
        switch_at = parse_duration(args.switch_at)
        duration = parse_duration(args.duration) if args.duration else None
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    sim = None
    targets = args.vllm
    if not targets:
        import os

        env_targets = os.environ.get(catalog.ENV_TARGETS, "").strip()
        targets = [u.strip() for u in env_targets.split(",") if u.strip()] or None
    if not targets:
        sim = build_simulation(simulation_args(
            replicas=args.replicas, scenario=args.scenario, switch_to=args.switch_to,
            switch_at=switch_at, rate=args.rate, port=args.sim_port))
        targets = sim.urls
    config = build_config(targets=targets, listen_address=args.listen_address,
                          interval=args.interval)
    exporter = Exporter(config)
    try:
        exporter.start()
    except OSError as exc:
        if sim is not None:
            sim.stop()
        raise ConfigError(f"cannot listen on {args.listen_address}: {exc.strerror}") from exc
    if sim is not None:
        sim.start()
    host, port = config.listen_host_port[0], exporter.port
    lines = ["", "prefixwatch demo is running:"]
    if sim is not None:
        lines += [f"  simulated vLLM replica {i}: {url}" for i, url in enumerate(sim.urls)]
        lines.append(f"  workload: {args.scenario}, switching to {args.switch_to} after "
                     f"{args.switch_at}")
    else:
        lines += [f"  watching vLLM: {u}" for u in targets]
    lines += [f"  exporter: http://{host}:{port}/  (metrics at /metrics)",
              f"  try: prefixwatch status --target {targets[0]}",
              "  Ctrl-C stops everything.", ""]
    print("\n".join(lines), flush=True)
    wait_for_signal(duration)
    exporter.stop()
    if sim is not None:
        sim.stop()
    log.info("demo stopped")
    return 0
