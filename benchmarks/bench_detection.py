"""Detection latency and noise of the generated alerts, in promtool's virtual time.

Scenarios at 15 s scrape and evaluation intervals, on vLLM's own series:
- collapse: 89% for 24 h (a healthy day), then 3% (a timestamp at the top of the prompt);
- both tiers collapse: 42% device + 46% host for 24 h, then 2% + 1% (the effective ratio);
- host rescue: 42% device + 46% host throughout (must not page on the effective ratio);
- dip: 89%, a 90 s dip to 40%, back to 89%;
- cold start: a restart, the cache cold (20%) for 8 minutes, then 89% again;
- trickle: 10 prompt tokens/s that never hit;
- idle: an hour of traffic, then none.
Rules compared on the same series, in the same run:
- prefixwatch: the generated PrefixCacheHitRateLow (critical path);
- naive rate: `sum(rate(hits[5m])) / sum(rate(queries[5m])) < 0.7`, for 5m;
- naive lifetime: `sum(hits_total) / sum(queries_total) < 0.7`, for 5m (what a lifetime-ratio
  dashboard would alert on);
- llm-d style: the 5 m ratio below 30% for 15 minutes, no traffic guard (as the issue
  describes llm-d's shipped rule).

Run: python benchmarks/bench_detection.py   (needs promtool: apt-get install prometheus)
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from prefixwatch.mixin import config as mixin_config
from prefixwatch.mixin import rules
from prefixwatch.mixin.alerttests import STEP, Cases, Phase

Q, H = "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"
COMPARED = {
    "naive rate": (f"sum(rate({H}[5m])) / sum(rate({Q}[5m])) < 0.7", "5m"),
    "naive lifetime": (f"sum({H}) / sum({Q}) < 0.7", "5m"),
    "llm-d style": (f"sum(rate({H}[5m])) / sum(rate({Q}[5m])) < 0.3", "15m"),
}
SCENARIOS = {
    "collapse": ([Phase(24 * 60, 1000, 0.89), Phase(12 * 60, 1000, 0.03)], 24 * 60, 12 * 60),
    "both tiers": ([Phase(24 * 60, 1000, 0.42, host=0.46), Phase(12 * 60, 1000, 0.02, host=0.01)],
                   24 * 60, 12 * 60),
    "host rescue": ([Phase(120, 1000, 0.42, host=0.46)], 0, 120),
    "dip (90s, 40%)": ([Phase(60, 1000, 0.89), Phase(1.5, 1000, 0.40), Phase(60, 1000, 0.89)],
                       60, 60),
    "cold start (8m)": ([Phase(60, 1000, 0.89), Phase(8, 1000, 0.2, reset=True),
                         Phase(60, 1000, 0.89)], 60, 60),
    "trickle": ([Phase(120, 10, 0.0)], 0, 120),
    "idle": ([Phase(60, 1000, 0.89), Phase(60, 0, 0.0)], 60, 60),
}
#: Scenarios that should page (the others must not, on the default effective ratio).
SHOULD_PAGE = ("collapse", "both tiers")


def first_firing(promtool: str, workdir: Path, phases: list[Phase], start_min: float,
                 span_min: float) -> dict[str, float | None]:
    """Minutes from start_min to the first evaluation with each alert firing (None: never)."""
    cases = Cases("vllm", mixin_config.MixinConfig(), "rules.yml")
    doc = rules.Builder("vllm", mixin_config.MixinConfig()).document()
    compared = [{"alert": name.replace(" ", "_").replace("-", "_"), "expr": expr, "for": for_,
                 "labels": {"severity": "critical"}} for name, (expr, for_) in COMPARED.items()]
    doc["groups"].append({"name": "compared", "interval": "15s", "rules": compared})
    (workdir / "rules.yml").write_text(yaml.safe_dump(doc, width=1000))
    names = ["PrefixCacheHitRateLow"] + [c["alert"] for c in compared]
    checks = []
    step_min = STEP / 60
    t = start_min
    # Coarse 1-minute checks after the first 30 minutes keep the test file small.
    while t <= start_min + span_min:
        for name in names:
            checks.append({"alertname": name, "eval_time": f"{round(t * 60)}s", "exp_alerts": []})
        t += step_min if t < start_min + 30 else 1.0
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "15s",
            "tests": [{"interval": "15s", "input_series": cases.traffic(phases),
                       "alert_rule_test": checks}]}
    (workdir / "test.yml").write_text(yaml.safe_dump(test, width=1000))
    run = subprocess.run([promtool, "test", "rules", str(workdir / "test.yml")],
                         capture_output=True, text=True)
    out = run.stdout + run.stderr
    found: dict[str, float | None] = dict.fromkeys(names)
    pattern = re.compile(r"alertname: (\w+), time: ([\ddhms]+),")
    for match in pattern.finditer(out):
        name, when = match.group(1), match.group(2)
        seconds = sum(int(n) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[u]
                      for n, u in re.findall(r"(\d+)([dhms])", when))
        minutes = seconds / 60 - start_min
        block = out[match.end(): out.find("alertname:", match.end())]
        got = block.split("got:", 1)[1] if "got:" in block else ""
        if "severity=\"critical\"" in got and (found[name] is None or minutes < found[name]):
            found[name] = minutes
    return {("prefixwatch" if k == "PrefixCacheHitRateLow" else k.replace("_", " ")
             .replace("llm d", "llm-d")): v for k, v in found.items()}


def main() -> None:
    promtool = shutil.which("promtool")
    if not promtool:
        sys.exit("promtool not found: apt-get install prometheus")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (phases, start, span) in SCENARIOS.items():
            results[name] = first_firing(promtool, Path(tmp), phases, start, span)
    rules_ = ["prefixwatch", *COMPARED]
    print("Minutes from the start of the event to a firing alert (15 s intervals);")
    print("'-' = never fired within the scenario. Only the collapses should fire (the compared")
    print("rules read the device counters only, so they page on the host rescue too).\n")
    print(f"{'scenario':18}" + "".join(f"{r:>16}" for r in rules_))
    for scenario, found in results.items():
        cells = [found.get(r) for r in rules_]
        print(f"{scenario:18}" + "".join(
            f"{'-' if c is None else f'{c:.2f}':>16}" for c in cells))
    for scenario, found in results.items():
        fired = found["prefixwatch"] is not None
        if fired != (scenario in SHOULD_PAGE):
            print(f"UNEXPECTED: prefixwatch {'paged' if fired else 'stayed quiet'} on {scenario}")
    ours = results["collapse"]["prefixwatch"]
    for other in COMPARED:
        theirs = results["collapse"][other]
        if ours and theirs:
            print(f"collapse: {other} takes {theirs / ours:.1f}x as long as prefixwatch")
        elif ours:
            print(f"collapse: {other} did not fire within 12 hours")


if __name__ == "__main__":
    main()
