"""Serve the real vLLM page on N loopback ports, counters moving on every request.

Used by bench_fleet.py; runs in its own process so its CPU is not the exporter's.
"""

from __future__ import annotations

import argparse
import itertools
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAGE = (Path(__file__).parent.parent / "tests" / "fixtures" / "vllm_metrics.txt").read_text()
Q_LINE = next(ln for ln in PAGE.splitlines() if ln.startswith("vllm:prefix_cache_queries_total{"))
H_LINE = next(ln for ln in PAGE.splitlines() if ln.startswith("vllm:prefix_cache_hits_total{"))


def make_handler(counter: itertools.count) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            n = next(counter)
            body = PAGE.replace(Q_LINE, Q_LINE.rsplit(" ", 1)[0] + f" {13902 + 2400 * n}.0")
            body = body.replace(H_LINE, H_LINE.rsplit(" ", 1)[0] + f" {7168 + 2100 * n}.0")
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--count", type=int, default=200)
    p.add_argument("--base-port", type=int, required=True)
    args = p.parse_args()
    for i in range(args.count):
        httpd = ThreadingHTTPServer(("127.0.0.1", args.base_port + i),
                                    make_handler(itertools.count()))
        httpd.daemon_threads = True
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
