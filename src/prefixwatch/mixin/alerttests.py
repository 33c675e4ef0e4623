"""promtool unit tests for the generated rules: every alert firing, not yet firing, never firing.

The cases are written once, in terms of traffic (prompt tokens per second and hit ratio over
time), and rendered for each source with that source's raw series names and labels, so the
exporter, vLLM and SGLang rule files are all held to the same behaviour. Run them with
``promtool test rules alerts/tests/*.yml``.

The input notation is promtoolinput.py's; the second tier's cases are tiercases.py's and the
cluster cases clustertests.py's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import yaml

from prefixwatch.core.vocab.exposition import (
    L_PART,
    OUT_ACHIEVABLE,
    OUT_DIAGNOSIS,
    OUT_LEDGER_TOKENS,
)
from prefixwatch.core.vocab.rulenames import (
    ALERT_ABSENT,
    ALERT_EVICTION,
    ALERT_LOW,
    ALERT_OUTLIER,
    ALERT_REGRESSION,
    ALERT_WATCHDOG,
    R_LEDGER_SHARE,
    R_MISSED,
    R_SAVED_SHARE,
    r_ratio,
)
from prefixwatch.core.vocab.tiers import TIER_DEVICE, TIER_HOST
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.mixin.alerts import render_diagnosis, render_ledger
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.kvtests import kv_cases
from prefixwatch.mixin.pagetiming import PageTimes, page_times
from prefixwatch.mixin.promtoolinput import (
    MODEL,
    STEP,
    Phase,
    compress,
    counters,
    render_annotation,
    sample,
)
from prefixwatch.mixin.routertests import router_cases
from prefixwatch.mixin.rules import Builder
from prefixwatch.mixin.sources import EXPORTER_JOB
from prefixwatch.mixin.tiercases import TierCases


class Cases(TierCases):
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
        qs, hs, xs = counters(phases)
        if vanish_after is not None:
            keep = round(vanish_after * 60 / STEP) + 1
            qs, hs, xs = qs[:keep], hs[:keep], xs[:keep]
        labels = self.base_labels(target)
        stale = " stale" if vanish_after is not None else ""
        return [{"series": self.series_name(metric, {**labels, **extra}),
                 "values": compress(values) + stale}
                for metric, extra, values in self.tier_series(phases, qs, hs, xs)]

    def tier_series(self, phases: Sequence[Phase], qs: list[float], hs: list[float],
                    xs: list[float]) -> list[tuple[str, dict[str, str], list[float]]]:
        """(metric, extra labels, values) of one replica as its engine (or the exporter)
        writes them: the device counters, the cached tokens by tier and, with a second tier,
        what shows it at work (connector lookups, HiCache backups)."""
        s, t = self.src, self.src.tiers
        assert t is not None
        tiered = any(p.host is not None for p in phases)
        misses = [q - h for q, h in zip(qs, hs, strict=True)]
        device = {t.label: t.written_value(TIER_DEVICE)}
        host = {t.label: t.written_value(TIER_HOST)}
        out: list[tuple[str, dict[str, str], list[float]]] = [
            (s.queries, {}, qs),
            (s.hits, device if t.cached == s.hits else {}, hs)]
        if t.total != s.queries:
            out.append((t.total, {}, qs))
        if t.cached != s.hits:
            out.append((t.cached, device, hs))
        if tiered:
            out.append((t.cached, host, xs))
            if s.ext_queries and s.ext_hits:
                out += [(s.ext_queries, {}, misses), (s.ext_hits, {}, xs)]
            else:
                for metric, matchers in t.active_counters:
                    assert not matchers
                    out.append((metric, {}, misses))
        return out

    def steady(self, metric: str, start: float, per_step: float, minutes: float,
               target: str) -> dict[str, str]:
        """A series of one replica from ``start``, growing ``per_step`` each step."""
        return {"series": self.series_name(metric, self.base_labels(target)),
                "values": f"{start:g}+{per_step:g}x{round(minutes * 60 / STEP)}"}

    # -- expectations --------------------------------------------------------------------------

    def diagnosis(self, target: str, cause: str, minutes_off: float, minutes_on: float
                  ) -> dict[str, str]:
        """The exporter's diagnosis series: 0 for a while, then 1."""
        labels = {**EXPORTER_JOB, "target": target, "model_name": MODEL, "cause": cause,
                  **self.extra}
        off, on = round(minutes_off * 60 / STEP), round(minutes_on * 60 / STEP)
        return {"series": self.series_name(OUT_DIAGNOSIS.name, labels),
                "values": compress([0.0] * (off + 1) + [1.0] * on)}

    def ledger(self, shares: dict[str, float], tokens_per_s: float, minutes: float
               ) -> list[dict[str, str]]:
        """The exporter's ledger counters, steady: ``shares`` of ``tokens_per_s`` logged
        prompt tokens by counted part (prompt is their sum)."""
        n = round(minutes * 60 / STEP)
        per_step = {**shares, "prompt": sum(shares.values())}
        return [{"series": self.series_name(f"{OUT_LEDGER_TOKENS.name}_total", {
                    **EXPORTER_JOB, "model_name": MODEL, L_PART: part, **self.extra}),
                 "values": f"0+{share * tokens_per_s * STEP:g}x{n}"}
                for part, share in sorted(per_step.items())]

    def ledger_sums(self, ledger: list[dict[str, str]]) -> list[dict[str, Any]]:
        """With ledger series, the recorded shares sum to 1 per model (achieved and a signed
        unexplained included), before and after the collapse (to a millionth: rates of
        integer counters divide to within a float's rounding)."""
        if not ledger:
            return []
        by = ",".join((*self.extra, "model_name"))
        labels = ",".join(f'{k}="{v}"' for k, v in sorted({**self.extra,
                                                            "model_name": MODEL}.items()))
        return [sample(f"round(sum by ({by}) ({R_LEDGER_SHARE}), 0.000001)", at,
                       f"{{{labels}}}", 1) for at in ("30m", "80m")]

    def expect(self, alertname: str, severity: str, labels: dict[str, str],
               value: float, causes: Sequence[str] = (),
               largest: tuple[str, float] | None = None) -> dict[str, Any]:
        """``largest``: the ledger's largest missed part and its share, when the case has
        ledger series (the description names it)."""
        rule = next(a for a in self.alerts
                    if a["alert"] == alertname and a["labels"]["severity"] == severity)
        full = {"alertname": alertname, "severity": severity, **labels}
        clause = self.builder.diagnosis_clause()
        rendered = render_diagnosis(list(causes), self.cfg.runbook_url_pattern)
        ledger = self.builder.ledger_clause()
        culprit = self.builder.culprit_clause()
        said = render_ledger(*(largest or (None, None)))

        def text(v: str) -> str:
            v = v.replace(clause, "\0")
            if culprit:  # no case has culprit series: the clause renders to nothing
                v = v.replace(culprit, "")
            if ledger:
                v = v.replace(ledger, "\1")
            return render_annotation(v, full, value).replace("\0", rendered).replace(
                "\1", said)

        annotations = {k: text(v) for k, v in rule["annotations"].items()}
        return {"exp_labels": {"severity": severity, **labels}, "exp_annotations": annotations}

    @staticmethod
    def fleet_sample(window: str, at: str, value: float) -> dict[str, Any]:
        """The recorded fleet ratio over ``window`` at ``at`` is ``value``."""
        return sample(r_ratio("model_name", window), at,
                      f'{r_ratio("model_name", window)}{{model_name="{MODEL}"}}', value)

    @staticmethod
    def at(alertname: str, minutes: float, alerts: list[dict[str, Any]]) -> dict[str, Any]:
        return {"alertname": alertname, "eval_time": _dur(minutes), "exp_alerts": alerts}

    # -- the cases -----------------------------------------------------------------------------

    @property
    def busy(self) -> float:
        """Prompt tokens per second well above the traffic floor."""
        return max(1000, round(10 * self.cfg.min_query_tokens_per_second))

    @property
    def high(self) -> float:
        """A healthy hit ratio well above the threshold (89% with the defaults)."""
        return round(min(0.99, max(0.89, self.cfg.hit_ratio_threshold + 0.19)), 6)

    def case(self, series: list[dict[str, str]], alerts: list[dict[str, Any]],
             exprs: list[dict[str, Any]] | None = None, exporter_alive: bool = True) -> None:
        """One promtool test: the series (with the exporter's liveness series, unless it is
        gone), the alert checks and the expression checks."""
        if self.src.target_up and exporter_alive and not any(
                s["series"].startswith(self.src.liveness) for s in series):
            series = [*series, {"series": self.series_name(self.src.liveness, EXPORTER_JOB),
                                "values": "1+0x1000"}]
        test: dict[str, Any] = {"interval": f"{STEP}s", "input_series": series,
                                "alert_rule_test": alerts}
        if exprs:
            test["promql_expr_test"] = exprs
        self.out.append(test)

    def tests(self) -> list[dict[str, Any]]:
        self.out: list[dict[str, Any]] = []
        for write in (self.collapse_case, self.fall_case, self.drift_case,
                      self.regression_case, self.idle_case, self.trickle_case,
                      self.restart_cases, self.dip_case, self.outlier_case,
                      self.eviction_case, self.vanished_case, self.nothing_case,
                      self.target_down_case, self.recording_case, self.capacity_case):
            write()
        self.tier_cases(self.case)
        kv_cases(self, self.case, Phase)
        router_cases(self, self.case, Phase)
        return self.out

    def paged_case(self, phases: list[Phase], start: float) -> tuple[PageTimes, list[dict]]:
        """The page's checks on phases whose fall starts at ``start`` minutes: nothing before
        the faster group order could fire, the page by the time the slower one does."""
        times = page_times(self.cfg, phases, self.builder.effective)
        assert times.earliest is not None and times.latest is not None, phases
        return times, [self.at(ALERT_LOW, start, []),
                       self.at(ALERT_LOW, times.earliest - STEP / 60, [])]

    def collapse_case(self) -> None:
        """1. The timestamp collapse, 89% -> 3% at 60m: critical within 75 s of the first
        sample that shows it, nothing before; the warning path is inhibited later by
        Alertmanager. The description names what the exporter diagnosed (and not what it did
        not) and, with a request log, where the misses went: the ledger's largest missed part
        (layout; pool_reach 10% against 3% achieved leaves 7% unexplained)."""
        m = {"model_name": MODEL}
        collapse = [Phase(60, self.busy, self.high), Phase(30, self.busy, 0.03)]
        diagnosed = [self.diagnosis("vllm-0:8000", "prefix_divergence", 61, 29),
                     self.diagnosis("vllm-0:8000", "eviction_pressure", 90, 0)]
        ledger = (self.ledger({"novel": 0.1, "layout": 0.8, "pool_reach": 0.1}, self.busy, 90)
                  if self.builder.ledger_clause() else [])
        largest = ("layout", 0.8) if ledger else None
        times, quiet = self.paged_case(collapse, 60)
        self.case(self.traffic(collapse) + diagnosed + ledger, [
            *quiet,
            self.at(ALERT_LOW, times.latest, [self.expect(
                ALERT_LOW, "critical", m, times.value, ["prefix_divergence"], largest)]),
            self.at(ALERT_REGRESSION, times.latest, []),
        ], [self.fleet_sample("5m", "30m", self.high)] + self.ledger_sums(ledger))

    def fall_case(self) -> None:
        """1b. A fall above the collapse level, 89% -> 50%: the long window confirms it, a page
        within 3 minutes."""
        thr = self.cfg.hit_ratio_threshold
        level = round(thr * self.cfg.critical_collapse_share, 6)
        to = round(thr - 0.2 if thr - 0.2 > level + 0.05 else (thr + level) / 2, 6)
        fall = [Phase(60, self.busy, self.high), Phase(20, self.busy, to)]
        times, quiet = self.paged_case(fall, 60)
        self.case(self.traffic(fall), [*quiet, self.at(ALERT_LOW, times.latest, [
            self.expect(ALERT_LOW, "critical", {"model_name": MODEL}, times.value)])])

    def drift_case(self) -> None:
        """2. A slow drift, threshold+15% -> threshold-15% over two hours, crossing the
        threshold at 60m: fires within 30m. Steps a minute longer than the short window,
        checked late in step k so that window (and the one evaluation before: rule groups may
        run in either order) lies inside it."""
        top = round(self.cfg.hit_ratio_threshold + 0.15, 6)
        step = math.ceil(parse_duration(self.cfg.critical_short_window) / 60) + 1
        n = math.ceil(120 / step)
        drift = [Phase(step, self.busy, top - 0.30 * i / n) for i in range(n)]
        k = math.ceil(75 / step)
        self.case(self.traffic(drift), [
            self.at(ALERT_LOW, 55, []),
            self.at(ALERT_LOW, (k + 1) * step - 0.5, [self.expect(
                ALERT_LOW, "critical", {"model_name": MODEL}, top - 0.30 * k / n)]),
        ])

    def regression_case(self) -> None:
        """3. Regression above the threshold: threshold + drop + 10% for 3h, then threshold +
        5%: a ticket within 25m, none before ``regression_for`` has passed (95% -> 75% with the
        defaults)."""
        cfg = self.cfg
        after = round(cfg.hit_ratio_threshold + 0.05, 6)
        before = round(min(0.99, after + cfg.regression_drop + 0.05), 6)
        reg = [Phase(180, self.busy, before), Phase(40, self.busy, after)]
        self.case(self.traffic(reg), [
            self.at(ALERT_REGRESSION, 180, []),
            self.at(ALERT_REGRESSION, 180 + parse_duration(cfg.regression_for) / 60, []),
            self.at(ALERT_REGRESSION, 205, [self.expect(ALERT_REGRESSION, "warning",
                                                        {"model_name": MODEL}, after)]),
            self.at(ALERT_LOW, 215, []),
        ])

    def idle_case(self) -> None:
        """4. No traffic at all after a busy hour: no alert (no NaN comparisons)."""
        idle = [Phase(30, self.busy, 0.9), Phase(60, 0, 0.0)]
        self.case(self.traffic(idle), [self.at(ALERT_LOW, 60, []), self.at(ALERT_LOW, 89, []),
                                       self.at(ALERT_REGRESSION, 89, [])])

    def trickle_case(self) -> None:
        """5. A trickle (a tenth of the traffic floor) that never hits: too small to mean
        anything."""
        trickle = self.cfg.min_query_tokens_per_second / 10
        self.case(self.traffic([Phase(60, trickle, 0.0)]), [self.at(ALERT_LOW, 30, []),
                                                            self.at(ALERT_LOW, 59, [])])

    def restart_cases(self) -> None:
        """6. A restart: counters reset, a cold cache for half the cold start, then warm again:
        quiet. ...but a cache that stays cold after the cold-start window does fire."""
        thr = self.cfg.hit_ratio_threshold
        cold = parse_duration(self.cfg.cold_start) / 60  # minutes
        warm = max(0.9, round(thr + 0.1, 6))
        chill = round(min(0.2, thr / 2), 6)  # a cold cache's ratio, below the threshold
        restart = [Phase(40, self.busy, warm), Phase(cold / 2, self.busy, chill, reset=True),
                   Phase(30, self.busy, warm)]
        self.case(self.traffic(restart), [self.at(ALERT_LOW, 40 + 0.4 * cold, []),
                                          self.at(ALERT_LOW, 40 + 0.7 * cold, []),
                                          self.at(ALERT_LOW, 50 + cold / 2, [])])
        stuck = [Phase(40, self.busy, warm), Phase(cold + 20, self.busy, chill, reset=True)]
        self.case(self.traffic(stuck), [
            self.at(ALERT_LOW, 40 + 0.8 * cold, []),
            self.at(ALERT_LOW, 45 + cold, [self.expect(ALERT_LOW, "critical",
                                                       {"model_name": MODEL}, chill)])])

    def dip_case(self) -> None:
        """7. A 90-second dip from 89% to 30 points below the threshold (40% at 70%), or just
        above the collapse level if that is higher: no page and no ticket, at any evaluation
        from the dip to ten minutes after it."""
        thr = self.cfg.hit_ratio_threshold
        level = round(thr * self.cfg.critical_collapse_share, 6)
        depth = round(max(0.0, thr - 0.3, level + 0.05), 6)
        dip = [Phase(40, self.busy, self.high), Phase(1.5, self.busy, depth),
               Phase(20, self.busy, self.high)]
        self.case(self.traffic(dip), [self.at(name, q / 4, []) for q in range(160, 208)
                                      for name in (ALERT_LOW, ALERT_REGRESSION)])

    def outlier_case(self) -> None:
        """8. One replica far below the fleet (90% vs 20%): outlier warning. Causes diagnosed
        on several replicas are named once each, sorted."""
        lag = max(0.0, round(0.7 - 2 * self.cfg.outlier_gap, 6))  # below fleet - gap
        good = self.traffic([Phase(60, self.busy, 0.9)], target="vllm-0:8000")
        bad = self.traffic([Phase(60, self.busy, lag)], target="vllm-1:8000")
        causes = [self.diagnosis("vllm-0:8000", "routing_spread", 5, 55),
                  self.diagnosis("vllm-1:8000", "routing_spread", 5, 55),
                  self.diagnosis("vllm-1:8000", "eviction_pressure", 5, 55)]
        self.case(good + bad + causes, [
            self.at(ALERT_OUTLIER, 10, []),
            self.at(ALERT_OUTLIER, 45, [self.expect(
                ALERT_OUTLIER, "warning", {"model_name": MODEL, "target": "vllm-1:8000"}, lag,
                ["eviction_pressure", "routing_spread"])]),
        ], [self.fleet_sample("15m", "45m", (0.9 + lag) / 2)])

    def eviction_case(self) -> None:
        """9. A full KV pool with preemptions (or a queue, on SGLang): eviction warning."""
        src, cfg = self.src, self.cfg
        if not src.kv_usage:
            return
        full = 0.98 if cfg.kv_usage_high < 0.98 else (1 + cfg.kv_usage_high) / 2
        pressure = [self.steady(src.kv_usage, full, 0, 60, "vllm-0:8000")]
        if src.preemptions:
            pressure.append(self.steady(src.preemptions, 0, 3, 60, "vllm-0:8000"))
        else:
            assert src.waiting
            pressure.append(self.steady(src.waiting, 4, 0, 60, "vllm-0:8000"))
        calm = [self.steady(src.kv_usage, full, 0, 60, "vllm-1:8000")]
        self.case(self.traffic([Phase(60, self.busy, 0.5)]) + pressure + calm, [
            self.at(ALERT_EVICTION, 5, []),
            self.at(ALERT_EVICTION, 30, [self.expect(
                ALERT_EVICTION, "warning", {"model_name": MODEL, "target": "vllm-0:8000"},
                full)]),
        ])

    def vanished_case(self) -> None:
        """10. The series vanish at 30m: metrics-absent fires for the model; hit-rate alerts
        cannot, which is why Alertmanager inhibits them on this alert."""
        self.case(self.traffic([Phase(60, self.busy, 0.9)], vanish_after=30), [
            self.at(ALERT_ABSENT, 30, []),
            self.at(ALERT_ABSENT, 40, [
                self.expect(ALERT_ABSENT, "warning", {"model_name": MODEL}, 1),
                self.expect(ALERT_ABSENT, "warning", {}, 1)]),
        ])

    def nothing_case(self) -> None:
        """11. Nothing at all: absent() fires; and the Watchdog always fires."""
        self.case([{"series": 'unrelated_metric{job="other"}', "values": "1+0x100"}], [
            self.at(ALERT_ABSENT, 10, [self.expect(ALERT_ABSENT, "warning", {}, 1)]),
            self.at(ALERT_WATCHDOG, 1, [self.expect(ALERT_WATCHDOG, "none", {}, 1)]),
        ], exporter_alive=False)

    def target_down_case(self) -> None:
        """12. The exporter says a target is down."""
        if not self.src.target_up:
            return
        up = {"series": self.series_name(self.src.target_up, {
            **EXPORTER_JOB, "target": "vllm-0:8000"}), "values": "1+0x20 0+0x40"}
        build = {"series": self.series_name(self.src.liveness, EXPORTER_JOB),
                 "values": "1+0x60"}
        self.case(self.traffic([Phase(60, self.busy, 0.9)]) + [up, build], [
            self.at(ALERT_ABSENT, 6, []),
            self.at(ALERT_ABSENT, 15, [self.expect(ALERT_ABSENT, "warning", {
                **EXPORTER_JOB, "target": "vllm-0:8000"}, 0)]),
        ])

    def recording_case(self) -> None:
        """13. Recording rules: the fleet ratio sums before dividing, the baseline is offset."""
        cfg = self.cfg
        busy = self.traffic([Phase(200, 3000, 0.9)], target="vllm-0:8000")
        quiet = self.traffic([Phase(200, 1000, 0.5)], target="vllm-1:8000")
        replica = r_ratio("model_name_target", "5m")
        self.case(busy + quiet, [], [
            self.fleet_sample("1h", "150m", 0.8),
            sample(cfg.baseline(), "190m", f'{cfg.baseline()}{{model_name="{MODEL}"}}', 0.8),
            sample(replica + '{target="vllm-1:8000"}', "60m",
                   f'{replica}{{model_name="{MODEL}",target="vllm-1:8000"}}', 0.5),
        ])

    def capacity_case(self) -> None:
        """14. Capacity and cost: 1000 prompt tokens/s at a 50% hit ratio, where the requests
        log says 75% was achievable: 500 tokens/s saved (a share of 0.5), and 250 tokens/s
        recomputed that an unlimited cache would have served."""
        src = self.src
        half = self.traffic([Phase(30, 1000, 0.5)])
        written = {x["series"].split("{")[0] for x in half}
        if src.prompt_tokens and src.prompt_tokens != src.queries:
            assert src.prompt_tokens_cached
            for metric, raw in ((src.prompt_tokens, src.queries),
                                (src.prompt_tokens_cached, src.hits)):
                if metric in written:
                    continue
                values = next(x["values"] for x in half if x["series"].startswith(raw + "{"))
                half.append({"series": self.series_name(metric, self.base_labels(
                    "vllm-0:8000")), "values": values})
        achievable = {"series": self.series_name(OUT_ACHIEVABLE.name, {
            **EXPORTER_JOB, "model_name": MODEL, "window": "5m"}), "values": "0.75+0x120"}
        exprs = [sample(f"round({R_MISSED}, 0.001)", "20m",  # float noise
                        f'{{model_name="{MODEL}"}}', 250)]
        if src.prompt_tokens and src.prompt_tokens_cached:
            exprs.append(sample(R_SAVED_SHARE, "20m", f'{R_SAVED_SHARE}{{model_name="{MODEL}"}}',
                                0.5))
        self.case(half + [achievable], [], exprs)

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
