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

Run: python benchmarks/bench_startup.py [--runs 15] [COMMAND ...]
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


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                   timeout=60)
    return time.perf_counter() - start


def heavy_imports(args: list[str]) -> list[str]:
    """The heavy top-level packages a command imports (from `-X importtime`)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-c", ENTRY, *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
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
    parser.add_argument("commands", nargs="*", default=list(COMMANDS),
                        help="prefixwatch arguments, one quoted string per command")
    opts = parser.parse_args()
    base = [sys.executable, "-c", "pass"]
    script = prefixwatch_argv()
    commands = [(c, script + c.split()) for c in opts.commands]
    for _, argv in [("", base), *commands]:  # warm-up: page cache, .pyc files
        wall(argv)
    times: dict[str, list[float]] = {"": []}
    times.update({c: [] for c, _ in commands})
    for _ in range(opts.runs):
        times[""].append(wall(base))
        for name, argv in commands:
            times[name].append(wall(argv))
    baseline = statistics.median(times[""])
    print(f"{opts.runs} runs each, interleaved; median wall time of the whole process")
    print(f"baseline `python -c pass`: {baseline * 1e3:7.1f} ms")
    worst = 0.0
    for name, _ in commands:
        median = statistics.median(times[name])
        worst = max(worst, median)
        heavy = ", ".join(heavy_imports(name.split())) or "none"
        print(f"prefixwatch {name:<18} {median * 1e3:7.1f} ms  {median / baseline:5.1f}x "
              f"the baseline, +{(median - baseline) * 1e3:6.1f} ms  (min "
              f"{min(times[name]) * 1e3:.1f}, max {max(times[name]) * 1e3:.1f}); "
              f"heavy imports: {heavy}")
    verdict = "meets" if worst < TARGET_SECONDS else "misses"
    print(f"slowest median {worst * 1e3:.1f} ms: {verdict} the target "
          f"(< {TARGET_SECONDS * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
