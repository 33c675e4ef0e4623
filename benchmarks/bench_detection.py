"""Time to page and time to resolve of the generated alerts, in promtool's virtual time.

Every scenario is one model's traffic (1,000 prompt tokens per second, 15 s scrape and
evaluation intervals) on one source's series; all of them run side by side in ONE promtool
test, so every rule sees the same samples in the same run:

- collapse to 3%: 89% for three hours, 3% for 20 minutes (a timestamp lands at the top of the
  prompt), then 89% again;
- fall to 50%: the same, at 50%;
- 90 s dip to 40%: 89%, 90 seconds at 40%, 89% again (must not page);
- slow drift: 85%, then a quarter of a point lower every minute, crossing 70% at the event,
  until a rollback to 85% 20 minutes later;
- regression from a high baseline: 95% for three hours, then 78% (above the threshold, 17
  points below its own level) for 50 minutes, then 95% again;
- both tiers collapse (42% device + 46% host, then 2% + 1%), host tier rescue (42% + 46%
  throughout), cold start (a restart, 20% for 8 minutes), trickle (10 tokens/s, no hits) and
  idle (traffic stops): the effective ratio and the noise the page must stay quiet on.

Rules compared: prefixwatch's page (PrefixCacheHitRateLow, critical), its ticket (the first of
PrefixCacheHitRateLow warning and PrefixCacheHitRateRegression), the naive
``sum(rate(hits[5m])) / sum(rate(queries[5m])) < 0.7`` for 5m, the lifetime ratio
``sum(hits_total) / sum(queries_total) < 0.7`` for 5m (what a lifetime-ratio dashboard would
alert on) and an llm-d style rule (the 5 m ratio below 30% for 15 minutes, no traffic guard).
The compared rules read the device counters only. A time to page is counted from
the event's first sample (for the drift, the first sample below 70%); a time to resolve from
the first sample of the recovery. The alert groups are evaluated before the recording rules
(the slower order: an alert reads ratios one evaluation old, as in a Prometheus whose alert
group runs just before its recording group; the other order is one evaluation faster).
("firing before": already firing on the healthy series).
"-" is never.

Run: python benchmarks/bench_detection.py [--source vllm|exporter]   (needs promtool)
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from prefixwatch.core.vocab.rulenames import ALERT_LOW, ALERT_REGRESSION
from prefixwatch.mixin.alerttests import Cases
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.promtoolinput import MODEL, STEP, Phase
from prefixwatch.mixin.rules import Builder
from prefixwatch.mixin.sources import SOURCES

BUSY = 1000  # prompt tokens per second
EVENT = 180.0  # minutes: every event starts here, after three healthy hours
#: The compared rules: (alert name, column heading, ratio expression, comparison, for).
COMPARED = (
    ("NaiveRate5mBelow70For5m", "naive rate5m < 0.7 for 5m", "rate5m", "< 0.7", "5m"),
    ("NaiveLifetimeBelow70For5m", "naive lifetime ratio", "lifetime", "< 0.7", "5m"),
    ("LlmdStyleBelow30For15m", "llm-d style (< 30% for 15m)", "rate5m", "< 0.3", "15m"),
)


@dataclass(frozen=True)
class Scenario:
    name: str
    phases: list[Phase]
    #: Minutes from the start to the first sample of the recovery (None: none to time).
    recovery: float | None = None
    #: Whether prefixwatch should page on it.
    pages: bool = False
    #: Minutes from the start to the event's first sample (the drift: its first below 70%).
    event: float = EVENT + STEP / 60


def drift() -> list[Phase]:
    """85% for two hours, then a quarter of a point lower each minute in 15 s steps (70% at
    the event), then back to 85% at EVENT + 20."""
    steps = round((EVENT + 20 - 120) * 60 / STEP)
    per_step = 0.0025 * STEP / 60
    return [Phase(120, BUSY, 0.85)] + [
        Phase(STEP / 60, BUSY, round(0.85 - per_step * (i + 1), 6)) for i in range(steps)
    ] + [Phase(30, BUSY, 0.85)]


def scenarios() -> list[Scenario]:
    healthy = Phase(EVENT, BUSY, 0.89)
    tiers = Phase(EVENT, BUSY, 0.42, host=0.46)
    return [
        Scenario("collapse to 3%", [healthy, Phase(20, BUSY, 0.03), Phase(30, BUSY, 0.89)],
                 EVENT + 20 + STEP / 60, pages=True),
        Scenario("fall to 50%", [healthy, Phase(20, BUSY, 0.50), Phase(30, BUSY, 0.89)],
                 EVENT + 20 + STEP / 60, pages=True),
        Scenario("90 s dip to 40%", [healthy, Phase(1.5, BUSY, 0.40), Phase(48.5, BUSY, 0.89)]),
        # The drift's first sample below 70%: 0.85 - k * 0.000625 < 0.7 from k = 241.
        Scenario("slow drift (0.25 points/min)", drift(), EVENT + 20 + STEP / 60, pages=True,
                 event=120 + 241 * STEP / 60),
        Scenario("regression 95% -> 78%", [Phase(EVENT, BUSY, 0.95), Phase(50, BUSY, 0.78),
                                           Phase(20, BUSY, 0.95)], EVENT + 50 + STEP / 60),
        Scenario("both tiers collapse", [tiers, Phase(20, BUSY, 0.02, host=0.01),
                                         Phase(30, BUSY, 0.42, host=0.46)],
                 EVENT + 20 + STEP / 60, pages=True),
        Scenario("host tier rescue", [Phase(EVENT + 50, BUSY, 0.42, host=0.46)]),
        Scenario("cold start (8 min)", [healthy, Phase(8, BUSY, 0.2, reset=True),
                                        Phase(42, BUSY, 0.89)]),
        Scenario("trickle (10 tokens/s)", [Phase(EVENT + 50, 10, 0.0)]),
        Scenario("idle (traffic stops)", [healthy, Phase(50, 0, 0.0)]),
    ]


def model_of(i: int) -> str:
    return f"{MODEL}-{i}"


def rule_file(source: str, cfg: MixinConfig) -> dict[str, Any]:
    """The source's rules (the alerts compared, every recording rule) and the naive rule."""
    builder = Builder(source, cfg)
    doc = builder.document()
    for group in doc["groups"]:
        group["rules"] = [r for r in group["rules"]
                          if r.get("alert") in (None, ALERT_LOW, ALERT_REGRESSION)]
    src = builder.src
    ratios = {"rate5m": f"sum by (model_name) (rate({src.hits}[5m]))\n"
                        f"/ sum by (model_name) (rate({src.queries}[5m]))",
              "lifetime": f"sum by (model_name) ({src.hits})\n"
                          f"/ sum by (model_name) ({src.queries})"}
    doc["groups"].append({"name": "naive", "interval": f"{STEP}s", "rules": [
        {"alert": name, "expr": f"{ratios[ratio]} {test}", "for": for_,
         "labels": {"severity": "critical"}} for name, _, ratio, test, for_ in COMPARED]})
    return doc


def test_file(source: str, cfg: MixinConfig, cases: list[Scenario]) -> dict[str, Any]:
    """One test: every scenario's series (one model each), a check of every compared alert at
    every evaluation from the first event to the end."""
    helper = Cases(source, cfg, "rules.yml")
    series = []
    for i, scenario in enumerate(cases):
        for s in helper.traffic(scenario.phases):
            series.append({**s, "series": s["series"].replace(
                f'model_name="{MODEL}"', f'model_name="{model_of(i)}"')})
    if helper.src.target_up:  # the exporter's own liveness series
        series.append({"series": helper.series_name(helper.src.liveness, {
            "job": "prefixwatch", "instance": "prefixwatch:9400"}), "values": "1+0x1200"})
    end = max(sum(p.minutes for p in s.phases) for s in cases)
    first = min(s.event for s in cases)
    checks = [{"alertname": name, "eval_time": f"{t * STEP}s", "exp_alerts": []}
              for t in range(round(first * 60 / STEP) - 1, round(end * 60 / STEP) + 1)
              for name in (ALERT_LOW, ALERT_REGRESSION, *(c[0] for c in COMPARED))]
    groups = [g["name"] for g in Builder(source, cfg).document()["groups"]]
    return {"rule_files": ["rules.yml"], "evaluation_interval": f"{STEP}s",
            "group_eval_order": [*reversed(groups), "naive"],
            "tests": [{"interval": f"{STEP}s", "input_series": series,
                       "alert_rule_test": checks}]}


_CHECK = re.compile(r"alertname: (\w+), time: ([\dhms.]+),")
_LABELS = re.compile(r"Labels:\{(.*?)\}\n")


def seconds(promtool_time: str) -> float:
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1}[u]
               for n, u in re.findall(r"([\d.]+)([hms])", promtool_time))


def firing(output: str) -> dict[tuple[str, str], set[float]]:
    """(model, column) -> the evaluation times (minutes) it fired at, from promtool's report of
    each check that expected nothing."""
    found: dict[tuple[str, str], set[float]] = {}
    matches = list(_CHECK.finditer(output))
    for k, match in enumerate(matches):
        end = matches[k + 1].start() if k + 1 < len(matches) else len(output)
        got = output[match.end():end].split("got:", 1)[-1]
        for labels in _LABELS.findall(got):
            pairs = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels))
            column = {ALERT_REGRESSION: "ticket", **{c[0]: c[0] for c in COMPARED}}.get(
                pairs["alertname"]) or (
                "page" if pairs.get("severity") == "critical" else "ticket")
            found.setdefault((pairs["model_name"], column), set()).add(
                seconds(match.group(2)) / 60)
    return found


def timing(times: set[float], scenario: Scenario
           ) -> tuple[float | None, float | None, bool, bool]:
    """Minutes from the event to the first firing, from the recovery to the first evaluation
    not firing after it, whether it still fired at the end, and whether it already fired
    before the event."""
    before = any(abs(t - (scenario.event - STEP / 60)) < 1e-6 for t in times)
    fired = sorted(t for t in times if t >= scenario.event)
    if not fired:
        return None, None, False, before
    page = fired[0] - scenario.event
    if scenario.recovery is None:
        return page, None, False, before
    t = scenario.recovery
    while round(t, 4) in {round(x, 4) for x in times}:
        t += STEP / 60
    end = sum(p.minutes for p in scenario.phases)
    return page, t - scenario.recovery, t > end, before


def cell(page: float | None, resolve: float | None, stuck: bool, before: bool) -> str:
    if page is None:
        return "-"
    if before:
        return "firing before" + (" and after" if stuck or resolve is None else "")
    after = ">end" if stuck else ("" if resolve is None else f"{resolve:.2f}")
    return f"{page:.2f} / {after}" if after else f"{page:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", choices=SOURCES[:2], default="vllm",
                        help="the series the rules read (default: vllm, scraped directly)")
    args = parser.parse_args()
    promtool = shutil.which("promtool")
    if not promtool:
        print("promtool not found: apt-get install prometheus", file=sys.stderr)
        return 2
    cfg, cases = MixinConfig(), scenarios()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "rules.yml").write_text(yaml.safe_dump(rule_file(args.source, cfg), width=1000))
        (work / "test.yml").write_text(yaml.safe_dump(test_file(args.source, cfg, cases),
                                                      width=1000))
        run = subprocess.run([promtool, "test", "rules", str(work / "test.yml")],
                             capture_output=True, text=True, check=False)
    out = run.stdout + run.stderr
    if not _CHECK.search(out) and run.returncode != 0:
        print(out[-3000:], file=sys.stderr)
        return 1
    fired = firing(out)
    print(f"Minutes to page / to resolve ({args.source} series, 15 s scrape and evaluation, "
          "one promtool run); '-' never fired.")
    columns = ("page", "ticket", *(c[0] for c in COMPARED))
    heads = ("prefixwatch page", "prefixwatch ticket", *(c[1] for c in COMPARED))
    print(f"{'scenario':30}" + "".join(f"{h:>28}" for h in heads))
    unexpected = []
    for i, scenario in enumerate(cases):
        cells = [timing(fired.get((model_of(i), c), set()), scenario) for c in columns]
        print(f"{scenario.name:30}" + "".join(f"{cell(*c):>28}" for c in cells))
        if (cells[0][0] is not None) != scenario.pages:
            did = "paged" if cells[0][0] is not None else "stayed quiet"
            unexpected.append(f"prefixwatch {did} on {scenario.name}")
    for line in unexpected:
        print("UNEXPECTED:", line)
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
