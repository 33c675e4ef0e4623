"""200 vLLM targets on loopback: one poll round's time, the exporter's CPU share and memory.

Targets (issue 2): a round inside a 15 s interval, under 25% of one core, RSS under 100 MB.
The baseline, measured in the same run, is what a full client_python parse of the same 200
pages would cost per interval (the parse alone, before any window math).

Run: python benchmarks/bench_fleet.py [--targets 200] [--interval 15] [--rounds 4]
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).parent
PAGE = (HERE.parent / "tests" / "fixtures" / "vllm_metrics.txt").read_text()
TICKS = os.sysconf("SC_CLK_TCK")


def free_port_block(count: int) -> int:
    """A base port with `count` free ports above it."""
    for base in range(20000, 60000, count + 7):
        ok = True
        for port in range(base, base + count + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free port block")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024
    hwm = int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    return rss, hwm


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def history_memory(targets: int, interval: float) -> float:
    """MB held by `targets` monitors after a full longest window (1 h) of history, built in
    virtual time from the real page (the live run above is too short to fill it)."""
    from prefixwatch.core.vocab import exposition
    from prefixwatch.core.vocab.windows import parse_duration
    from prefixwatch.exporter.config import TargetConfig
    from prefixwatch.exporter.monitor import TargetMonitor

    windows = {w: parse_duration(w) for w in exposition.DEFAULT_WINDOWS}
    q_line = next(ln for ln in PAGE.splitlines() if ln.startswith("vllm:prefix_cache_queries"))
    polls = int(max(windows.values()) / interval) + 10
    pages = [PAGE.replace(q_line, q_line.rsplit(" ", 1)[0] + f" {13902 + 2400 * i}.0")
             for i in range(polls)]
    before = rss_mb(os.getpid())[0]
    monitors = [TargetMonitor(TargetConfig(f"http://10.0.0.{i}:8000/metrics", name=f"t{i}"),
                              windows, interval) for i in range(targets)]
    for i in range(polls):
        for mon in monitors:
            mon.ingest(pages[i], 1_000_000.0 + i * interval)
    del pages
    assert all(m.view.up for m in monitors)
    return rss_mb(os.getpid())[0] - before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--targets", type=int, default=200)
    p.add_argument("--interval", type=float, default=15.0)
    p.add_argument("--rounds", type=int, default=4, help="rounds measured after a warm-up round")
    p.add_argument("--skip-history", action="store_true",
                   help="skip the in-process measure of a full hour of history")
    p.add_argument("--history-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.history_only:
        print(f"{history_memory(args.targets, args.interval):.1f}")
        return

    start = time.process_time()
    for _ in range(20):
        list(text_string_to_metric_families(PAGE))
    full_parse = (time.process_time() - start) / 20

    base = free_port_block(args.targets)
    fleet = subprocess.Popen([sys.executable, str(HERE / "fleet_server.py"), "--count",
                              str(args.targets), "--base-port", str(base)],
                             stdout=subprocess.PIPE, text=True)
    assert fleet.stdout is not None and fleet.stdout.readline().strip() == "ready"
    listen = base + args.targets
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as fh:
        yaml.safe_dump({"interval": args.interval, "listen_address": f"127.0.0.1:{listen}",
                        "targets": [f"http://127.0.0.1:{base + i}/metrics"
                                    for i in range(args.targets)]}, fh)
        cfg = fh.name
    exporter = subprocess.Popen([sys.executable, "-m", "prefixwatch.cli", "--log-level",
                                 "warning", "exporter", "--config", cfg],
                                stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{listen}/metrics"
    try:
        def rounds_done() -> tuple[int, str]:
            try:
                text = requests.get(url, timeout=5).text
            except requests.ConnectionError:
                return 0, ""
            ups = sum(1 for ln in text.splitlines()
                      if ln.startswith("prefixwatch_target_up{") and ln.endswith(" 1.0"))
            return ups, text

        deadline = time.monotonic() + args.interval * 2 + 30
        while rounds_done()[0] < args.targets and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(args.interval)  # one more round, so every target has a window
        cpu0, wall0 = cpu_seconds(exporter.pid), time.monotonic()
        durations = []
        for _ in range(args.rounds):
            time.sleep(args.interval)
            _, text = rounds_done()
            durations.append(metric(text, "prefixwatch_poll_round_duration_seconds") or 0.0)
        cpu1, wall1 = cpu_seconds(exporter.pid), time.monotonic()
        rss, hwm = rss_mb(exporter.pid)
        ups, text = rounds_done()
        ratios = sum(1 for ln in text.splitlines()
                     if ln.startswith("prefixwatch_prefix_cache_hit_ratio{")
                     and 'window="1m"' in ln)
    finally:
        exporter.terminate()
        fleet.terminate()
        exporter.wait(10)
        fleet.wait(10)
        os.unlink(cfg)

    share = (cpu1 - cpu0) / (wall1 - wall0)
    baseline_share = full_parse * args.targets / args.interval
    print(f"targets: {args.targets}, interval {args.interval:g}s, measured {args.rounds} rounds")
    print(f"targets up: {ups}, with a 1m hit ratio: {ratios}")
    print(f"poll round duration: max {max(durations):.2f}s, "
          f"mean {sum(durations) / len(durations):.2f}s (must stay under {args.interval:g}s)")
    print(f"exporter CPU: {share:.1%} of one core (target < 25%)")
    print(f"baseline, full client_python parse of the same pages: {baseline_share:.1%} of one "
          f"core for the parse alone; exporter total / baseline = {share / baseline_share:.2f}")
    print(f"exporter memory: RSS {rss:.1f} MB, peak {hwm:.1f} MB (target < 100 MB)")
    if not args.skip_history:
        out = subprocess.run([sys.executable, __file__, "--history-only", "--targets",
                              str(args.targets), "--interval", str(args.interval)],
                             capture_output=True, text=True, check=True).stdout
        print(f"RSS growth of {args.targets} monitors over a full 1h window of history "
              f"(virtual time, same code): {float(out):.1f} MB")


if __name__ == "__main__":
    main()
