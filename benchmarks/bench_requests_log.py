"""Memory of the exporter's request-level view on an endless request log.

Target: memory stays bounded however long the log runs. The same endless stream of vLLM
request log lines (three tenants' 400-token system prompts, each request with its own
200-token user turn) is fed to

- the exporter's view (``RequestsLogReader.feed_lines`` into a ``RequestView``: a sliding
  window of the last 4,096 requests), and
- the baseline: the audit's one-pass index (``Auditor``), which keeps every block it has seen,

each in a fresh process, and the peak RSS is read after N requests for growing N. Printed:
each one's peak RSS at N relative to its own at the first N (bounded: ~1.0x however long the
log), the view's RSS relative to the baseline's at the same N, and the view's throughput in
requests per second relative to the baseline's.

    python benchmarks/bench_requests_log.py            # N = 8k, 16k, 32k, 64k
    python benchmarks/bench_requests_log.py --quick    # N = 4k, 8k, 16k
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Iterator

TENANTS = 3
SYSTEM_TOKENS = 400
USER_TOKENS = 200


def endless_log(seed: int = 11) -> Iterator[str]:
    """vLLM 0.33 request log lines (DEBUG details + INFO received), forever."""
    rng = random.Random(seed)
    systems = [[rng.randrange(128_000) for _ in range(SYSTEM_TOKENS)] for _ in range(TENANTS)]
    n = 0
    while True:
        n += 1
        ids = systems[rng.randrange(TENANTS)] + [rng.randrange(128_000)
                                                 for _ in range(USER_TOKENS)]
        yield (f"DEBUG 11-30 06:11:52 [request_logger.py:47] Request cmpl-{n} details: prompt: "
               f"'...', prompt_token_ids: {ids}, prompt_embeds shape: None.")
        yield (f"INFO 11-30 06:11:52 [request_logger.py:57] Received request cmpl-{n}: params: "
               "SamplingParams(n=1), lora_request: None.")


def child(variant: str, requests: int) -> None:
    from prefixwatch.audit.analysis import Auditor
    from prefixwatch.core.logs.formats import LogRequest, VllmLogJoiner, parse_line
    from prefixwatch.exporter.requestlog.reader import RequestsLogConfig, RequestsLogReader
    from prefixwatch.exporter.requestlog.view import RequestView

    lines = endless_log()
    started = time.perf_counter()
    if variant == "view":
        view = RequestView()
        reader = RequestsLogReader(RequestsLogConfig("-", tokenizer="none"), view)
        batch: list[str] = []
        for _ in range(requests * 2):
            batch.append(next(lines))
            if len(batch) == 512:
                reader.feed_lines(batch, "log", 1)
                batch = []
        reader.feed_lines(batch, "log", 1)
        reader.flush()
        held = view.window_size()
    else:
        auditor = Auditor(16)
        joiner = VllmLogJoiner()
        for i in range(requests * 2):
            for item in parse_line(next(lines), f"log:{i}", joiner) or ():
                if isinstance(item, LogRequest) and item.token_ids is not None:
                    auditor.add(item.token_ids, item.extra_keys)
        held = (auditor.report.requests, auditor.index.blocks)
    seconds = time.perf_counter() - started
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"variant": variant, "requests": requests, "seconds": seconds,
                      "peak_mb": peak_kb / 1024, "held": held}))


def run(variant: str, requests: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", variant, str(requests)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller N (about a minute)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    sizes = (4_000, 8_000, 16_000) if args.quick else (8_000, 16_000, 32_000, 64_000)
    print(f"endless vLLM request log: {TENANTS} tenants, {SYSTEM_TOKENS}+{USER_TOKENS} tokens "
          "a request; peak RSS of a fresh process after N requests")
    print(f"{'N':>7}  {'view MB':>8}  {'vs own first':>12}  {'audit MB':>9}  "
          f"{'vs own first':>12}  {'view/audit':>10}  {'req/s view/audit':>16}")
    first: dict[str, float] = {}
    for n in sizes:
        view, audit = run("view", n), run("audit", n)
        first.setdefault("view", view["peak_mb"])
        first.setdefault("audit", audit["peak_mb"])
        speed = (n / view["seconds"]) / (n / audit["seconds"])
        print(f"{n:>7}  {view['peak_mb']:>8.1f}  {view['peak_mb'] / first['view']:>11.2f}x  "
              f"{audit['peak_mb']:>9.1f}  {audit['peak_mb'] / first['audit']:>11.2f}x  "
              f"{view['peak_mb'] / audit['peak_mb']:>9.2f}x  {speed:>15.2f}x")
    print(f"the view held {view['held'][0]} requests and {view['held'][1]} blocks at the end; "
          f"the audit index {audit['held'][1]} blocks")


if __name__ == "__main__":
    main()
