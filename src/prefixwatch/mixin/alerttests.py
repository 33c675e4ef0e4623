"""promtool unit tests for the generated rules: every alert firing, not yet firing, never firing.

The cases are written once, in terms of traffic (prompt tokens per second and hit ratio over
time), and rendered for each source with that source's raw series names and labels, so the
exporter, vLLM and SGLang rule files are all held to the same behaviour. Run them with
``promtool test rules alerts/tests/*.yml``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from prefixwatch.core.names import OUT_ACHIEVABLE, OUT_DIAGNOSIS
from prefixwatch.core.rulenames import (
    ALERT_ABSENT,
    ALERT_EVICTION,
    ALERT_LOW,
    ALERT_OUTLIER,
    ALERT_REGRESSION,
    ALERT_WATCHDOG,
    R_BASELINE,
    R_MISSED,
    R_SAVED_SHARE,
    r_ratio,
)
from prefixwatch.core.windows import parse_duration
from prefixwatch.mixin.alerts import render_diagnosis
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.rules import Builder
from prefixwatch.mixin.sources import EXPORTER_JOB

STEP = 15  # seconds between samples and rule evaluations
MODEL = "llama-3-8b"


@dataclass
class Phase:
    """Traffic for a while: prompt tokens per second and the share served from cache."""

    minutes: float
    tokens_per_s: float
    hit_ratio: float
    reset: bool = False  # the server restarted at the start of this phase


def counters(phases: Sequence[Phase]) -> tuple[list[float], list[float]]:
    """Cumulative queries and hits, one sample per STEP, with restarts as counter resets."""
    q = h = 0.0
    qs, hs = [0.0], [0.0]
    for phase in phases:
        if phase.reset:
            q = h = 0.0
            qs[-1], hs[-1] = q, h
        for _ in range(round(phase.minutes * 60 / STEP)):
            q += phase.tokens_per_s * STEP
            h += phase.tokens_per_s * STEP * phase.hit_ratio
            qs.append(q)
            hs.append(h)
    return qs, hs


def compress(values: Sequence[float | None]) -> str:
    """promtool's expanding notation: runs of equal steps become 'a+bxN'."""
    out: list[str] = []
    i = 0
    n = len(values)

    def fmt(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else repr(round(v, 6))

    while i < n:
        v = values[i]
        if v is None:
            out.append("_")
            i += 1
            continue
        j = i + 1
        if j < n and values[j] is not None:
            step = values[j] - v  # type: ignore[operator]
            while j + 1 < n and values[j + 1] is not None and abs(
                    (values[j + 1] - values[j]) - step) < 1e-9:  # type: ignore[operator]
                j += 1
            if j - i >= 2:
                sign = "+" if step >= 0 else "-"
                out.append(f"{fmt(v)}{sign}{fmt(abs(step))}x{j - i}")
                i = j + 1
                continue
        out.append(fmt(v))
        i += 1
    return " ".join(out)


def humanize_percentage(value: float) -> str:
    text = f"{value * 100:.4g}"
    return f"{text}%"


_EQ_CHAIN = re.compile(r'\{\{ if eq \$labels\.(\w+) "(.*?)" \}\}(.*?)'
                       r'((?:\{\{ else if eq \$labels\.\w+ ".*?" \}\}.*?)*)'
                       r"\{\{ else \}\}(.*?)\{\{ end \}\}")
_ELSE_IF = re.compile(r'\{\{ else if eq \$labels\.(\w+) "(.*?)" \}\}(.*?)(?=\{\{ else |$)')


def render_annotation(template: str, labels: dict[str, str], value: float) -> str:
    """The few template constructs our annotations use, rendered as Prometheus would."""
    text = template.replace("{{ $value | humanizePercentage }}", humanize_percentage(value))

    def chain(match: re.Match[str]) -> str:
        branches = [(match.group(1), match.group(2), match.group(3))]
        branches += _ELSE_IF.findall(match.group(4))
        for label, wanted, body in branches:
            if labels.get(label) == wanted:
                return body
        return match.group(5)

    text = _EQ_CHAIN.sub(chain, text)

    def cond(match: re.Match[str]) -> str:
        return match.group(2) if labels.get(match.group(1)) else ""

    text = re.sub(r"\{\{ if \$labels\.(\w+) \}\}(.*?)\{\{ end \}\}", cond, text)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)


class Cases:
    """The cases for one source, with traffic levels chosen around the config's numbers (a
    threshold of 0.5 gets a drift that crosses 0.5, a cold start of 5m a restart within 5m)."""

    def __init__(self, source: str, cfg: MixinConfig, rule_file: str) -> None:
        self.source = source
        self.cfg = cfg
        self.builder = Builder(source, cfg)
        self.src = self.builder.src
        self.rule_file = rule_file
        self.alerts = self.builder.alerts()
        #: Labels every input series also carries (a cluster's external label).
        self.extra: dict[str, str] = {}

    # -- series --------------------------------------------------------------------------------

    def base_labels(self, target: str) -> dict[str, str]:
        return {**self.src.sample_labels(target, MODEL), **self.extra}

    @staticmethod
    def series_name(metric: str, labels: dict[str, str]) -> str:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return f"{metric}{{{inner}}}"

    def traffic(self, phases: Sequence[Phase], target: str = "vllm-0:8000",
                vanish_after: float | None = None) -> list[dict[str, str]]:
        qs, hs = counters(phases)
        if vanish_after is not None:
            keep = round(vanish_after * 60 / STEP) + 1
            qs = qs[:keep]
            hs = hs[:keep]
        labels = self.base_labels(target)
        out = []
        for metric, values in ((self.src.queries, qs), (self.src.hits, hs)):
            text = compress(values)
            if vanish_after is not None:
                text += " stale"
            out.append({"series": self.series_name(metric, labels), "values": text})
        return out

    def gauge(self, metric: str, value: float, minutes: float, target: str) -> dict[str, str]:
        n = round(minutes * 60 / STEP)
        return {"series": self.series_name(metric, self.base_labels(target)),
                "values": f"{value:g}+0x{n}"}

    def counter_rate(self, metric: str, per_step: float, minutes: float,
                     target: str) -> dict[str, str]:
        n = round(minutes * 60 / STEP)
        return {"series": self.series_name(metric, self.base_labels(target)),
                "values": f"0+{per_step:g}x{n}"}

    # -- expectations --------------------------------------------------------------------------

    def diagnosis(self, target: str, cause: str, minutes_off: float, minutes_on: float
                  ) -> dict[str, str]:
        """The exporter's diagnosis series: 0 for a while, then 1."""
        labels = {**EXPORTER_JOB, "target": target, "model_name": MODEL, "cause": cause,
                  **self.extra}
        off, on = round(minutes_off * 60 / STEP), round(minutes_on * 60 / STEP)
        return {"series": self.series_name(OUT_DIAGNOSIS.name, labels),
                "values": compress([0.0] * (off + 1) + [1.0] * on)}

    def expect(self, alertname: str, severity: str, labels: dict[str, str],
               value: float, causes: Sequence[str] = ()) -> dict[str, Any]:
        rule = next(a for a in self.alerts
                    if a["alert"] == alertname and a["labels"]["severity"] == severity)
        full = {"alertname": alertname, "severity": severity, **labels}
        clause = self.builder.diagnosis_clause()
        rendered = render_diagnosis(list(causes), self.cfg.runbook_url_pattern)
        annotations = {k: render_annotation(v.replace(clause, "\0"), full, value).replace(
            "\0", rendered) for k, v in rule["annotations"].items()}
        return {"exp_labels": {"severity": severity, **labels}, "exp_annotations": annotations}

    @staticmethod
    def at(alertname: str, minutes: float, alerts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"alertname": alertname, "eval_time": _dur(minutes), "exp_alerts": alerts}

    # -- the cases -----------------------------------------------------------------------------

    def tests(self) -> list[dict[str, Any]]:
        m = {"model_name": MODEL}
        low, regression = ALERT_LOW, ALERT_REGRESSION
        tests: list[dict[str, Any]] = []
        cfg = self.cfg
        thr = cfg.hit_ratio_threshold
        busy = max(1000, round(10 * cfg.min_query_tokens_per_second))  # well above the floor
        cold = parse_duration(cfg.cold_start) / 60  # minutes

        def case(series: list[dict[str, str]], alerts: list[dict[str, Any]],
                 exprs: list[dict[str, Any]] | None = None, exporter_alive: bool = True) -> None:
            if self.src.target_up and exporter_alive and not any(
                    s["series"].startswith(self.src.liveness) for s in series):
                series = [*series, {"series": self.series_name(self.src.liveness, EXPORTER_JOB),
                    "values": "1+0x1000"}]
            test: dict[str, Any] = {"interval": f"{STEP}s", "input_series": series,
                                    "alert_rule_test": alerts}
            if exprs:
                test["promql_expr_test"] = exprs
            tests.append(test)

        # 1. The timestamp collapse, 89% -> 3% at 60m: critical within 5 minutes (aim 3),
        #    nothing before, the warning path inhibited later by Alertmanager.
        #    The description names what the exporter diagnosed (and not what it did not).
        collapse = [Phase(60, busy, 0.89), Phase(30, busy, 0.03)]
        diagnosed = [self.diagnosis("vllm-0:8000", "prefix_divergence", 61, 29),
                     self.diagnosis("vllm-0:8000", "eviction_pressure", 90, 0)]
        #    The 5m ratio falls below the threshold (5 * (0.89 - thr) / 0.86) minutes after the
        #    switch, then `for: 2m`: 64m at 70%, later for a lower threshold.
        paged = 60 + math.ceil(5 * (0.89 - thr) / 0.86 + 2.75)
        case(self.traffic(collapse) + diagnosed, [
            self.at(low, 60, []),
            self.at(low, 62, []),
            self.at(low, paged, [self.expect(low, "critical", m, 0.03, ["prefix_divergence"])]),
            self.at(regression, paged, []),
        ], [{"expr": r_ratio("model_name", "5m"), "eval_time": "30m",
             "exp_samples": [{"labels": f'{r_ratio("model_name", "5m")}{{model_name="{MODEL}"}}',
                              "value": 0.89}]}])
        # 2. A slow drift, threshold+15% -> threshold-15% over two hours, crossing the threshold
        #    at 60m: fires within 30m. Two-minute steps, so the 1m window at 75m30s lies inside
        #    one step (74m-76m), and so does the one evaluation before (rule groups may run in
        #    either order).
        top = round(thr + 0.15, 6)
        drift = [Phase(2, busy, top - 0.30 * i / 60) for i in range(60)]
        case(self.traffic(drift), [
            self.at(low, 55, []),
            self.at(low, 75.5, [self.expect(low, "critical", m, top - 0.30 * 37 / 60)]),
        ])
        # 3. Regression above the threshold: threshold + drop + 10% for 3h, then threshold + 5%:
        #    warning within 30m (95% -> 75% with the defaults).
        after = round(thr + 0.05, 6)
        before = round(min(0.99, after + cfg.regression_drop + 0.05), 6)
        reg = [Phase(180, busy, before), Phase(40, busy, after)]
        case(self.traffic(reg), [
            self.at(regression, 180, []),
            self.at(regression, 205, [self.expect(regression, "warning", m, after)]),
            self.at(low, 215, []),
        ])
        # 4. No traffic at all after a busy hour: no alert (no NaN comparisons).
        idle = [Phase(30, busy, 0.9), Phase(60, 0, 0.0)]
        case(self.traffic(idle), [self.at(low, 60, []), self.at(low, 89, []),
                                  self.at(regression, 89, [])])
        # 5. A trickle (a tenth of the traffic floor) that never hits: too small to mean anything.
        trickle = cfg.min_query_tokens_per_second / 10
        case(self.traffic([Phase(60, trickle, 0.0)]), [self.at(low, 30, []),
                                                       self.at(low, 59, [])])
        # 6. A restart: counters reset, a cold cache for half the cold start, then warm again:
        #    quiet.
        warm = max(0.9, round(thr + 0.1, 6))
        chill = round(min(0.2, thr / 2), 6)  # a cold cache's ratio, below the threshold
        restart = [Phase(40, busy, warm), Phase(cold / 2, busy, chill, reset=True),
                   Phase(30, busy, warm)]
        case(self.traffic(restart), [self.at(low, 40 + 0.4 * cold, []),
                                     self.at(low, 40 + 0.7 * cold, []),
                                     self.at(low, 50 + cold / 2, [])])
        #    ...but a cache that stays cold after the cold-start window does fire.
        stuck = [Phase(40, busy, warm), Phase(cold + 20, busy, chill, reset=True)]
        case(self.traffic(stuck), [
            self.at(low, 40 + 0.8 * cold, []),
            self.at(low, 45 + cold, [self.expect(low, "critical", m, chill)])])
        # 7. A dip shorter than two minutes: no page.
        dip = [Phase(40, busy, warm), Phase(1.75, busy, 0.03), Phase(20, busy, warm)]
        case(self.traffic(dip), [self.at(low, m_, []) for m_ in (41, 42, 43, 44, 46, 50)])
        # 8. One replica far below the fleet (90% vs 20%): outlier warning.
        #    Causes diagnosed on several replicas are named once each, sorted.
        lag = max(0.0, round(0.7 - 2 * cfg.outlier_gap, 6))  # below fleet - gap
        good = self.traffic([Phase(60, busy, 0.9)], target="vllm-0:8000")
        bad = self.traffic([Phase(60, busy, lag)], target="vllm-1:8000")
        causes = [self.diagnosis("vllm-0:8000", "routing_spread", 5, 55),
                  self.diagnosis("vllm-1:8000", "routing_spread", 5, 55),
                  self.diagnosis("vllm-1:8000", "eviction_pressure", 5, 55)]
        case(good + bad + causes, [
            self.at(ALERT_OUTLIER, 10, []),
            self.at(ALERT_OUTLIER, 45, [self.expect(
                ALERT_OUTLIER, "warning", {**m, "target": "vllm-1:8000"}, lag,
                ["eviction_pressure", "routing_spread"])]),
        ], [{"expr": r_ratio("model_name", "15m"), "eval_time": "45m",
             "exp_samples": [{"labels": f'{r_ratio("model_name", "15m")}{{model_name="{MODEL}"}}',
                              "value": (0.9 + lag) / 2}]}])
        # 9. A full KV pool with preemptions (or a queue, on SGLang): eviction warning.
        if self.src.kv_usage:
            full = 0.98 if cfg.kv_usage_high < 0.98 else (1 + cfg.kv_usage_high) / 2
            pressure = [self.gauge(self.src.kv_usage, full, 60, "vllm-0:8000")]
            if self.src.preemptions:
                pressure.append(self.counter_rate(self.src.preemptions, 3, 60, "vllm-0:8000"))
            else:
                assert self.src.waiting
                pressure.append(self.gauge(self.src.waiting, 4, 60, "vllm-0:8000"))
            calm = [self.gauge(self.src.kv_usage, full, 60, "vllm-1:8000")]
            case(self.traffic([Phase(60, busy, 0.5)]) + pressure + calm, [
                self.at(ALERT_EVICTION, 5, []),
                self.at(ALERT_EVICTION, 30, [self.expect(
                    ALERT_EVICTION, "warning", {**m, "target": "vllm-0:8000"}, full)]),
            ])
        # 10. The series vanish at 30m: metrics-absent fires for the model; hit-rate alerts
        #     cannot, which is why Alertmanager inhibits them on this alert.
        case(self.traffic([Phase(60, busy, 0.9)], vanish_after=30), [
            self.at(ALERT_ABSENT, 30, []),
            self.at(ALERT_ABSENT, 40, [self.expect(ALERT_ABSENT, "warning", m, 1),
                                       self.expect(ALERT_ABSENT, "warning", {}, 1)]),
        ])
        # 11. Nothing at all: absent() fires; and the Watchdog always fires.
        case([{"series": 'unrelated_metric{job="other"}', "values": "1+0x100"}], [
            self.at(ALERT_ABSENT, 10, [self.expect(ALERT_ABSENT, "warning", {}, 1)]),
            self.at(ALERT_WATCHDOG, 1, [self.expect(ALERT_WATCHDOG, "none", {}, 1)]),
        ], exporter_alive=False)
        if self.src.target_up:
            # 12. The exporter says a target is down.
            up = {"series": self.series_name(self.src.target_up, {
                **EXPORTER_JOB, "target": "vllm-0:8000"}),
                "values": "1+0x20 0+0x40"}
            build = {"series": self.series_name(self.src.liveness, EXPORTER_JOB),
                     "values": "1+0x60"}
            case(self.traffic([Phase(60, busy, 0.9)]) + [up, build], [
                self.at(ALERT_ABSENT, 6, []),
                self.at(ALERT_ABSENT, 15, [self.expect(ALERT_ABSENT, "warning", {
                    **EXPORTER_JOB, "target": "vllm-0:8000"}, 0)]),
            ])
        # 13. Recording rules: the fleet ratio sums before dividing, the baseline is offset.
        busy = self.traffic([Phase(200, 3000, 0.9)], target="vllm-0:8000")
        quiet = self.traffic([Phase(200, 1000, 0.5)], target="vllm-1:8000")
        case(busy + quiet, [], [
            {"expr": r_ratio("model_name", "1h"), "eval_time": "150m",
             "exp_samples": [{"labels": f'{r_ratio("model_name", "1h")}{{model_name="{MODEL}"}}',
                              "value": 0.8}]},
            {"expr": R_BASELINE, "eval_time": "190m",
             "exp_samples": [{"labels": f'{R_BASELINE}{{model_name="{MODEL}"}}', "value": 0.8}]},
            {"expr": r_ratio("model_name_target", "5m") + '{target="vllm-1:8000"}',
             "eval_time": "60m",
             "exp_samples": [{"labels": f'{r_ratio("model_name_target", "5m")}'
                                        f'{{model_name="{MODEL}",target="vllm-1:8000"}}',
                              "value": 0.5}]},
        ])
        # 14. Capacity and cost: 1000 prompt tokens/s at a 50% hit ratio, where the requests
        #     log says 75% was achievable: 500 tokens/s saved (a share of 0.5), and 250 tokens/s
        #     recomputed that an unlimited cache would have served.
        half = self.traffic([Phase(30, 1000, 0.5)])
        if self.src.prompt_tokens and self.src.prompt_tokens != self.src.queries:
            assert self.src.prompt_tokens_cached
            for metric, raw in ((self.src.prompt_tokens, self.src.queries),
                                (self.src.prompt_tokens_cached, self.src.hits)):
                values = next(x["values"] for x in half if x["series"].startswith(raw + "{"))
                half.append({"series": self.series_name(metric, self.base_labels(
                    "vllm-0:8000")), "values": values})
        achievable = {"series": self.series_name(OUT_ACHIEVABLE.name, {
            **EXPORTER_JOB, "model_name": MODEL, "window": "5m"}), "values": "0.75+0x120"}
        exprs = [{"expr": f"round({R_MISSED}, 0.001)", "eval_time": "20m",  # float noise
                  "exp_samples": [{"labels": f'{{model_name="{MODEL}"}}', "value": 250}]}]
        if self.src.prompt_tokens and self.src.prompt_tokens_cached:
            exprs.append({"expr": R_SAVED_SHARE, "eval_time": "20m",
                          "exp_samples": [{"labels": f'{R_SAVED_SHARE}{{model_name="{MODEL}"}}',
                                           "value": 0.5}]})
        case(half + [achievable], [], exprs)
        return tests

    def document(self) -> dict[str, Any]:
        return {"rule_files": [self.rule_file], "evaluation_interval": f"{STEP}s",
                "tests": self.tests()}


def _dur(minutes: float) -> str:
    seconds = round(minutes * 60)
    return f"{seconds // 60}m{seconds % 60}s" if seconds % 60 else f"{seconds // 60}m"


def render(source: str, rule_file: str, cfg: MixinConfig | None = None) -> str:
    doc = Cases(source, cfg or MixinConfig(), rule_file).document()
    header = (f"# Generated by `prefixwatch generate`: promtool unit tests for the\n"
              f"# {source} rules. Run: promtool test rules {rule_file.rsplit('/', 1)[0]}/"
              f"tests/*.yml\n")
    return header + yaml.safe_dump(doc, sort_keys=False, width=1000)
