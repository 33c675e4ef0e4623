"""The exporter's landing page with its charts, for 200 targets with an hour of history.

Target (issue 15): a page render under 50 ms with 200 targets. The baseline, measured in the
same run, is the exporter's own /metrics exposition for the same 200 targets (what Prometheus
asks for every scrape); the ratio says what the page costs next to it.

Each target's history is an hour of polls at a 5 s interval (the real vLLM 0.33 page with
counters growing, a regression half-way); one target is ingested poll by poll and its history
copied to the others, so the setup stays fast and the render sees 200 full histories.

Run: python benchmarks/bench_landing.py [--targets 200] [--repeat 20]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

from prometheus_client import generate_latest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets  # noqa: E402
from prefixwatch.exporter.landing import render_landing  # noqa: E402
from prefixwatch.exporter.service import Exporter  # noqa: E402
from tests.conftest import with_counters  # noqa: E402

PAGE = (HERE.parent / "tests" / "fixtures" / "vllm_metrics.txt").read_text()
INTERVAL = 5.0


def build(targets: int) -> Exporter:
    urls = [TargetConfig(f"http://127.0.0.1:{20000 + i}/metrics") for i in range(targets)]
    exporter = Exporter(ExporterConfig(targets=name_targets(urls), interval=INTERVAL,
                                       listen_address="127.0.0.1:0"))
    first = exporter.monitors[0]
    now = time.time() - 3600
    queries = hits = 0.0
    for i in range(int(3600 / INTERVAL)):
        queries += 5000
        hits += 4500 if i < 360 else 200
        first.ingest(with_counters(PAGE, queries, hits), now + i * INTERVAL)
    for mon in exporter.monitors[1:]:
        with first.lock:
            mon.series = copy.deepcopy(first.series)
            mon.snapshot, mon.models = first.snapshot, first.models
        mon.up = mon.polled = True
        mon.last_success = first.last_success
    exporter.update_diagnosis(first.last_success)
    return exporter


def timed(fn, repeat: int) -> float:
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
    page = render_landing(exporter)
    landing = timed(lambda: render_landing(exporter), args.repeat)
    metrics = timed(lambda: generate_latest(exporter.registry), args.repeat)
    print(f"targets                 {args.targets}")
    print(f"landing page (charts)   {landing * 1000:7.1f} ms   ({len(page) / 1024:.0f} KiB, "
          f"{page.count('<svg')} charts)")
    print(f"/metrics (baseline)     {metrics * 1000:7.1f} ms")
    print(f"ratio                   {landing / metrics:7.2f}x")
    ok = landing < 0.050
    print(f"target: under 50 ms     {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
