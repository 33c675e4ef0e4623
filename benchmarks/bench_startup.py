"""Start-up time of the `prefixwatch` command, as a whole process, against `python -c pass`.

Target: `prefixwatch --help`, `prefixwatch exporter --help` and `prefixwatch status --help`
each start in under 0.3 s on a 2-core machine; every command pays its imports before it does
anything (the exporter's start, each `status` run, every container restarted by its
healthcheck), so a command imports only what it uses (matplotlib only for figures, numpy only
where it is needed). The baseline, measured in the same run and interleaved with the commands
(so a noisy machine slows both alike), is the bare interpreter: `python -c pass`. The ratio says
what prefixwatch adds to it.

Each command also runs once under `python -X importtime`, and the heavy libraries it loaded are
listed (none is the goal for these three commands).

`--against SRC` also times another source tree (e.g. an older checkout's `src/`, put first on
PYTHONPATH) in the same interleaved run, and prints how much faster this one starts.

Run: python benchmarks/bench_startup.py [--runs 15] [--against OLD/src] [COMMAND ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ("--help", "exporter --help", "status --help")
HEAVY = ("matplotlib", "numpy", "opentelemetry", "grafanalib", "jinja2", "transformers",
         "requests", "yaml", "prometheus_client", "PIL")
TARGET_SECONDS = 0.3
ENTRY = "import sys; from prefixwatch.cli import main; sys.exit(main())"


def prefixwatch_argv() -> list[str]:
    """The console script next to this interpreter (what users run), else the same entry
    point through `python -c`."""
    script = Path(sys.executable).with_name("prefixwatch")
    if script.exists():
        return [str(script)]
    found = shutil.which("prefixwatch")
    return [found] if found else [sys.executable, "-c", ENTRY]


def with_path(src: str | None) -> dict[str, str] | None:
    if src is None:
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (src, os.environ.get("PYTHONPATH")) if p)}


def wall(argv: list[str], env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   timeout=60, env=env)
    return time.perf_counter() - start


def heavy_imports(args: list[str], src: str | None = None) -> list[str]:
    """The heavy top-level packages a command imports (from `-X importtime`)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", ENTRY, *args],
                          capture_output=True, text=True, timeout=60,
                          env={**(with_path(src) or os.environ), "PYTHONDONTWRITEBYTECODE": "1"})
    loaded = set()
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        module = line.rsplit("|", 1)[1].strip()
        loaded.add(module.split(".", 1)[0])
    return [name for name in HEAVY if name in loaded]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs of each (default 15)")
    parser.add_argument("--against", metavar="SRC",
                        help="another source tree to time in the same run (its src/ directory)")
    parser.add_argument("commands", nargs="*", default=list(COMMANDS),
                        help="prefixwatch arguments, one quoted string per command")
    opts = parser.parse_args()
    base = [sys.executable, "-c", "pass"]
    script = prefixwatch_argv()
    # (label, command line, environment): the baseline, each command, and each command of the
    # other tree when asked.
    runs: list[tuple[str, list[str], dict[str, str] | None]] = [("", base, None)]
    runs += [(c, script + c.split(), None) for c in opts.commands]
    if opts.against:
        other = with_path(opts.against)
        runs += [(f"against:{c}", [sys.executable, "-c", ENTRY, *c.split()], other)
                 for c in opts.commands]
    for _, argv, env in runs:  # warm-up: page cache, .pyc files
        wall(argv, env)
    times: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    for _ in range(opts.runs):
        for label, argv, env in runs:
            times[label].append(wall(argv, env))
    baseline = statistics.median(times[""])
    print(f"{opts.runs} runs each, interleaved; median wall time of the whole process")
    print(f"baseline `python -c pass`: {baseline * 1e3:7.1f} ms")
    worst = 0.0
    for label, _, _ in runs[1:]:
        median = statistics.median(times[label])
        name = label.removeprefix("against:")
        src = opts.against if label.startswith("against:") else None
        if src is None:
            worst = max(worst, median)
        heavy = ", ".join(heavy_imports(name.split(), src)) or "none"
        tree = f"[{src}] " if src else ""
        print(f"{tree}prefixwatch {name:<18} {median * 1e3:7.1f} ms  {median / baseline:5.1f}x "
              f"the baseline, +{(median - baseline) * 1e3:6.1f} ms  (min "
              f"{min(times[label]) * 1e3:.1f}, max {max(times[label]) * 1e3:.1f}); "
              f"heavy imports: {heavy}")
    if opts.against:
        for name in opts.commands:
            old, new = (statistics.median(times[k]) for k in (f"against:{name}", name))
            print(f"prefixwatch {name:<18} starts {old / new:4.1f}x faster than in "
                  f"{opts.against} ({(old - baseline) * 1e3:.0f} ms -> "
                  f"{(new - baseline) * 1e3:.0f} ms above the baseline)")
    verdict = "meets" if worst < TARGET_SECONDS else "misses"
    print(f"slowest median {worst * 1e3:.1f} ms: {verdict} the target "
          f"(< {TARGET_SECONDS * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
