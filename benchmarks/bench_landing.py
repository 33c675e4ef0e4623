"""The exporter's landing page with its charts, for 200 targets with an hour of history.

Target (issue 15): a page render under 50 ms with 200 targets. The baseline, measured in the
same run, is the exporter's own /metrics exposition for the same 200 targets (what Prometheus
asks for every scrape); the ratio says what the page costs next to it.

Each target's history is an hour of polls at a 5 s interval (the real vLLM 0.33 page with its
prefix-cache counters and TTFT histogram growing, a regression half-way); one target is ingested
poll by poll and its history copied to the others, so the setup stays fast. The steady state is
measured honestly: before every timed render each target ingests one new poll (outside the
timing), as a real refresh sees (the page refreshes every 15 s, targets are polled every 5 s),
so a render always has a new partial bin, and now and then a bin completes and the grid moves.
The first (cold) render, which fills the chart cache, is reported apart.

Run: python benchmarks/bench_landing.py [--targets 200] [--repeat 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import generate_latest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets  # noqa: E402
from prefixwatch.exporter.landing import charts_section  # noqa: E402
from prefixwatch.exporter.service import Exporter  # noqa: E402
from tests.conftest import with_counters  # noqa: E402

PAGE = (HERE.parent / "tests" / "fixtures" / "vllm_metrics.txt").read_text()
INTERVAL = 5.0
HOUR = int(3600 / INTERVAL)
TTFT = "vllm:time_to_first_token_seconds_"


def poll_page(i: int) -> str:
    """The page at poll ``i``: counters grown, the TTFT histogram grown ``i + 1`` times (plus
    slow requests after the regression, so its median moves)."""
    queries = 5000.0 * (i + 1)
    hits = 4500.0 * min(i + 1, HOUR // 2) + 200.0 * max(0, i + 1 - HOUR // 2)
    slow = 3.0 * max(0, i + 1 - HOUR // 2)
    out = []
    for line in with_counters(PAGE, queries, hits).splitlines():
        if line.startswith(TTFT + "bucket{") or line.startswith(TTFT + "count{"):
            head, _, value = line.rpartition(" ")
            le = line.split('le="', 1)[1].split('"', 1)[0] if "le=" in line else "+Inf"
            line = f"{head} {float(value) * (i + 1) + (slow if float(le) >= 1.0 else 0.0)}"
        out.append(line)
    return "\n".join(out) + "\n"


def build(targets: int) -> Exporter:
    """The exporter with an hour of history per target."""
    urls = [TargetConfig(f"http://127.0.0.1:{20000 + i}/metrics") for i in range(targets)]
    exporter = Exporter(ExporterConfig(targets=name_targets(urls), interval=INTERVAL,
                                       listen_address="127.0.0.1:0"))
    first = exporter.monitors[0]
    start = time.time() - 3600
    for i in range(HOUR - 1):
        first.ingest(poll_page(i), start + i * INTERVAL)
    for mon in exporter.monitors[1:]:
        # The same hour without polling it again: a copy of the first monitor's history (its
        # private state, copied here only to build the benchmark's fleet quickly).
        mon._histories = copy.deepcopy(first._histories)
    last = start + (HOUR - 1) * INTERVAL
    for mon in exporter.monitors:  # the hour's last poll: every target publishes its view
        mon.ingest(poll_page(HOUR - 1), last)
    exporter.update_diagnosis(last)
    return exporter


def steady(exporter: Exporter, render: Callable[[], object], first: int, repeat: int
           ) -> list[float]:
    """Render times, each after one new poll (``first``, ``first + 1``, ... after the hour)
    of every target (not timed)."""
    runs = []
    last = exporter.monitors[0].view.last_success
    for step in range(repeat):
        text = poll_page(HOUR + first + step)
        for mon in exporter.monitors:
            mon.ingest(text, last + (step + 1) * INTERVAL)
        started = time.perf_counter()
        render()
        runs.append(time.perf_counter() - started)
    return runs


def timed(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    exporter = build(args.targets)
    started = time.perf_counter()
    page = exporter.landing_page()
    cold = time.perf_counter() - started
    runs = steady(exporter, exporter.landing_page, 0, args.repeat)
    landing = statistics.median(runs)
    # The charts alone (the rest of the page is the targets' table), on further new polls.
    alone = steady(exporter, lambda: charts_section(exporter.landing_inputs(), time.time()),
                   args.repeat, args.repeat)
    metrics = timed(lambda: generate_latest(exporter.registry), args.repeat)
    print(f"targets                 {args.targets}")
    print(f"landing page (charts)   {landing * 1000:7.1f} ms   median of {args.repeat}, a new "
          f"poll per target before each (min {min(runs) * 1000:.1f}, max {max(runs) * 1000:.1f};"
          f" {len(page) / 1024:.0f} KiB, {page.count('<svg')} charts)")
    print(f"charts section alone    {statistics.median(alone) * 1000:7.1f} ms   median, "
          f"same way (min {min(alone) * 1000:.1f}, max {max(alone) * 1000:.1f})")
    print(f"first render (cold)     {cold * 1000:7.1f} ms   (fills the chart cache)")
    print(f"/metrics (baseline)     {metrics * 1000:7.1f} ms")
    print(f"ratio                   {landing / metrics:7.2f}x")
    ok = landing < 0.050
    print(f"target: under 50 ms     {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
