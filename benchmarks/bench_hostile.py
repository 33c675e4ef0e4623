"""The exporter's own /metrics with hostile pages on its target: size and scrape time.

Issue 16: with a 10,000-model page (and 10,000 new names on every poll, 60,000 buckets, a
3 MiB label) the exporter's /metrics must stay under a few MB and a scrape under 1 s. The
baseline, measured in the same run, is the same exporter with the real vLLM page; the
hostile cases are reported as ratios against it. Everything runs in-process on loopback.

Run: python benchmarks/bench_hostile.py [--polls 3]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests

from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.service import Exporter

PAGE = (Path(__file__).parent.parent / "tests" / "fixtures" / "vllm_metrics.txt").read_text()
_fresh = itertools.count()


def models_page(count: int, fresh: bool = False) -> str:
    tag = f"p{next(_fresh)}-" if fresh else ""
    lines = []
    for i in range(count):
        labels = f'engine="0",model_name="{tag}model-{i}"'
        lines += [f"vllm:prefix_cache_queries_total{{{labels}}} 100",
                  f"vllm:prefix_cache_hits_total{{{labels}}} 50",
                  f"vllm:num_requests_running{{{labels}}} 1"]
    return "\n".join(lines) + "\n"


def buckets_page(count: int) -> str:
    base = models_page(1).rstrip("\n").split("\n")
    for i in range(count):
        base.append(f'vllm:time_to_first_token_seconds_bucket{{engine="0",'
                    f'model_name="model-0",le="{i / 1000:.3f}"}} {i}')
    base.append('vllm:time_to_first_token_seconds_bucket{engine="0",model_name="model-0",'
                f'le="+Inf"}} {count}')
    return "\n".join(base) + "\n"


CASES = {
    "real vLLM page (baseline)": lambda: PAGE,
    "10,000 models": lambda: models_page(10_000),
    "10,000 new names every poll": lambda: models_page(10_000, fresh=True),
    "60,000 buckets": lambda: buckets_page(60_000),
    "3 MiB label": lambda: models_page(1).replace('engine="0"', 'engine="0",lora="'
                                                    + "x" * (3 << 20) + '"', 1),
}


class Target:
    def __init__(self, make) -> None:  # noqa: ANN001
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                body = make().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # OSError: the exporter hung up (a cap or its deadline), its business.
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def measure(make, polls: int) -> tuple[int, float, float]:  # noqa: ANN001
    """(bytes of /metrics, worst scrape seconds, worst poll seconds) after ``polls`` polls."""
    target = Target(make)
    cfg = ExporterConfig(targets=name_targets([TargetConfig(target.url, timeout=10)]),
                         interval=60, listen_address="127.0.0.1:0")
    exporter = Exporter(cfg)
    exporter.start()
    try:
        worst_poll = worst_scrape = 0.0
        size = 0
        for _ in range(polls):
            worst_poll = max(worst_poll, exporter.poll_round())
            t0 = time.perf_counter()
            body = requests.get(f"http://127.0.0.1:{exporter.port}/metrics", timeout=30).content
            worst_scrape = max(worst_scrape, time.perf_counter() - t0)
            size = max(size, len(body))
        return size, worst_scrape, worst_poll
    finally:
        exporter.stop()
        target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=3)
    args = parser.parse_args()
    rows = [(name, *measure(make, args.polls)) for name, make in CASES.items()]
    base_size, base_scrape = rows[0][1], rows[0][2]
    print(f"{'case':30} {'/metrics':>10} {'x base':>7} {'scrape':>9} {'x base':>7} {'poll':>8}")
    for name, size, scrape, poll in rows:
        print(f"{name:30} {size / 1024:8.0f}KB {size / base_size:7.1f} {scrape * 1000:7.0f}ms "
              f"{scrape / base_scrape:7.1f} {poll * 1000:6.0f}ms")
    worst = max(rows, key=lambda r: r[1])
    slowest = max(rows, key=lambda r: r[2])
    ok = worst[1] < 4 * 1024 * 1024 and slowest[2] < 1.0
    print(f"\nlargest /metrics {worst[1] / 1024:.0f} KB ({worst[0]}), slowest scrape "
          f"{slowest[2] * 1000:.0f} ms ({slowest[0]}): "
          f"{'within' if ok else 'OVER'} the 4 MB / 1 s target")


if __name__ == "__main__":
    main()
