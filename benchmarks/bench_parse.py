"""CPU per poll of one real vLLM page: prefixwatch's reader vs a full client_python parse.

Target (issue 2): at least 4x less CPU than `text_string_to_metric_families` on the same page.
Run: python benchmarks/bench_parse.py
"""

from __future__ import annotations

import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.exporter.pagereader import LabelCache, read_page

PAGE = (Path(__file__).parent.parent / "tests" / "fixtures" / "vllm_metrics.txt").read_text()


def cpu_per_call(fn, repeat: int) -> float:
    fn()  # warm-up (and the label memo's first fill, as on a target's first poll)
    best = float("inf")
    for _ in range(5):
        start = time.process_time()
        for _ in range(repeat):
            fn()
        best = min(best, (time.process_time() - start) / repeat)
    return best


def main() -> None:
    labels = LabelCache()
    full = cpu_per_call(lambda: list(text_string_to_metric_families(PAGE)), 100)
    ours = cpu_per_call(lambda: read_page(PAGE, labels), 500)
    cold = cpu_per_call(lambda: read_page(PAGE, LabelCache()), 100)
    print(f"page: {len(PAGE):,} bytes, {PAGE.count(chr(10))} lines")
    print(f"baseline full parse (client_python):   {full * 1e3:7.3f} ms CPU per poll")
    print(f"prefixwatch read_page (steady state):  {ours * 1e3:7.3f} ms CPU per poll")
    print(f"prefixwatch read_page (first poll):    {cold * 1e3:7.3f} ms CPU per poll")
    print(f"ratio steady state: {full / ours:.1f}x less CPU (target >= 4x)")
    print(f"ratio first poll:   {full / cold:.1f}x less CPU")


if __name__ == "__main__":
    main()
