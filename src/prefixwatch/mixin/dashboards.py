"""Grafana dashboards, generated with grafanalib from core's metric names and the recording rules.

Two dashboards: the on-call *overview* (is the prefix cache working, since when not, on which
model and replica, and what it costs in TTFT) and a *replica* drill-down. Both read the
exporter's ``prefixwatch_*`` series by default, or vLLM's own series with ``--source vllm``.

The JSON is made deterministic (stable uids and panel ids, sorted keys) and normalised to
Grafana's current dashboard schema: grafanalib writes legacy keys and nulls (``"value":
"null"`` on base threshold steps, ``rows``, ``schemaVersion`` 12, ...); we drop nulls and
legacy keys and declare the schema version of the panel JSON we actually emit (see
docs/dashboards.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from prefixwatch.core import names, schemas
from prefixwatch.mixin import rules

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RUNBOOK_URL = rules.DEFAULT_RUNBOOK_URL
THRESHOLD = names.DEFAULT_HIT_RATIO_THRESHOLD
SOURCES = ("exporter", "vllm")


@dataclass(frozen=True)
class Series:
    """Raw series names and the replica label, for one source."""

    source: str
    queries: str
    hits: str
    ext_queries: str
    ext_hits: str
    ttft_bucket: str
    prompt_len_bucket: str
    kv_usage: str
    preemptions: str
    running: str
    waiting: str
    replica: str  # label naming a replica
    base: str  # a series every target has, for label_values()


def series_for(source: str) -> Series:
    if source == "exporter":
        return Series(
            source, queries=names.OUT_QUERIES.name + "_total",
            hits=names.OUT_HITS.name + "_total",
            ext_queries=names.OUT_EXT_QUERIES.name + "_total",
            ext_hits=names.OUT_EXT_HITS.name + "_total",
            ttft_bucket=names.OUT_TTFT.name + "_bucket",
            prompt_len_bucket=names.OUT_PROMPT_LEN.name + "_bucket",
            kv_usage=names.OUT_KV_USAGE.name, preemptions=names.OUT_PREEMPTIONS.name + "_total",
            running=names.OUT_RUNNING.name, waiting=names.OUT_WAITING.name,
            replica=names.L_TARGET, base=names.OUT_QUERIES.name + "_total")
    if source == "vllm":
        v = schemas.VLLM_V1
        assert v.queries and v.hits and v.ext_queries and v.ext_hits and v.ttft
        assert v.prompt_len and v.kv_usage and v.preemptions and v.running and v.waiting
        return Series(
            source, queries=v.queries, hits=v.hits, ext_queries=v.ext_queries,
            ext_hits=v.ext_hits, ttft_bucket=v.ttft + "_bucket",
            prompt_len_bucket=v.prompt_len + "_bucket", kv_usage=v.kv_usage,
            preemptions=v.preemptions, running=v.running, waiting=v.waiting,
            replica="instance", base=v.queries)
    raise ValueError(f"unknown source {source!r}; one of {', '.join(SOURCES)}")


class Panels:
    """PromQL and panels for one source and one scope (all replicas, or one)."""

    def __init__(self, s: Series, one_replica: bool) -> None:
        self.s = s
        self.one = one_replica
        replica = f',{s.replica}=~"$instance"' if one_replica else ""
        self.m = f'{{job=~"$job",model_name=~"$model"{replica}}}'
        self._id = 0
        self.panels: list[Any] = []

    def sel(self, metric: str) -> str:
        return metric + self.m

    def rate(self, metric: str) -> str:
        return f"rate({self.sel(metric)}[$__rate_interval])"

    def ratio(self, by: str) -> str:
        hits = f"sum by ({by}) ({self.rate(self.s.hits)})"
        queries = f"sum by ({by}) ({self.rate(self.s.queries)})"
        return f"{hits}\n/\n({queries} > 0)"

    def quantile(self, q: str, bucket: str, by: str = "model_name") -> str:
        return f"histogram_quantile({q}, sum by ({by}, le) ({self.rate(bucket)}))"

    @staticmethod
    def target(expr: str, legend: str, ref: str) -> g.Target:
        return g.Target(expr=expr, legendFormat=legend, refId=ref, datasource=DATASOURCE)

    def add(self, panel: Any, x: int, y: int, w: int, h: int) -> None:
        self._id += 1
        panel.id = self._id
        panel.gridPos = g.GridPos(h=h, w=w, x=x, y=y)
        panel.dataSource = DATASOURCE
        self.panels.append(panel)

    # -- panels ------------------------------------------------------------------------------

    def hit_rate_now(self, x: int, y: int, w: int = 6, h: int = 5) -> None:
        if self.one:
            expr = self.ratio("model_name")
        else:
            expr = f'{rules.r_ratio(rules.MODEL, "5m")}{{model_name=~"$model"}}'
        self.add(g.Stat(
            title="Hit rate now (5m)",
            description=f"Share of prompt tokens served from the prefix cache over the last 5 "
                        f"minutes, per model (sum of hits over sum of queries, all replicas). "
                        f"Red below {THRESHOLD:.0%}, where PrefixCacheHitRateLow fires. Empty "
                        f"means no traffic, not a broken cache.",
            targets=[self.target(expr, "{{model_name}}", "A")],
            format="percentunit", decimals=1, reduceCalc="lastNotNull", graphMode="area",
            noValue="no traffic",
            thresholds=[g.Threshold("red", 0, 0.0), g.Threshold("green", 1, THRESHOLD)]),
            x, y, w, h)

    def ttft_now(self, x: int, y: int, w: int = 6, h: int = 5) -> None:
        if self.one:
            targets = [self.target(self.quantile(q, self.s.ttft_bucket), f"p{p} {{{{model_name}}}}",
                                   ref) for q, p, ref in (("0.5", "50", "A"), ("0.95", "95", "B"))]
        else:
            base = f'{rules.R_TTFT}{{model_name=~"$model"'
            targets = [self.target(f'{base},quantile="{q}"}}', f"p{p} {{{{model_name}}}}", ref)
                       for q, p, ref in (("0.5", "50", "A"), ("0.95", "95", "B"))]
        self.add(g.Stat(
            title="TTFT p50 / p95 (5m)",
            description="Time to first token. When the hit rate falls, TTFT rises: prompts "
                        "are prefilled from scratch. If the hit rate fell and TTFT did not "
                        "move, the cache was not helping where the traffic goes.",
            targets=targets, format="s", decimals=2, reduceCalc="lastNotNull",
            thresholds=[g.Threshold("green", 0, 0.0), g.Threshold("orange", 1, 1.0)]),
            x, y, w, h)

    def tokens_saved(self, x: int, y: int, w: int = 6, h: int = 5) -> None:
        self.add(g.Stat(
            title="Prefill tokens saved per second",
            description="Prompt tokens per second served from the prefix cache instead of "
                        "being prefilled: the GPU work the cache saves right now.",
            targets=[self.target(f"sum ({self.rate(self.s.hits)})", "tokens/s", "A")],
            format="short", decimals=0, reduceCalc="lastNotNull",
            thresholds=[g.Threshold("blue", 0, 0.0)]), x, y, w, h)

    def firing_alerts(self, x: int, y: int, w: int = 6, h: int = 5) -> None:
        expr = ('count(ALERTS{alertstate="firing",alertname=~"PrefixCache.*"}) or vector(0)')
        self.add(g.Stat(
            title="Firing prefix-cache alerts",
            description="PrefixCache* alerts firing now (see the runbook link above). 0 is "
                        "good; the Watchdog is not counted.",
            targets=[self.target(expr, "firing", "A")], format="short", decimals=0,
            reduceCalc="lastNotNull", graphMode="none",
            thresholds=[g.Threshold("green", 0, 0.0), g.Threshold("red", 1, 1.0)]),
            x, y, w, h)

    def hit_rate_over_time(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        self.add(g.TimeSeries(
            title="Hit rate over time",
            description=f"Prefix-cache hit rate per model, with the {THRESHOLD:.0%} alert "
                        "threshold drawn. A cliff is a deploy (a prompt that now changes near "
                        "the top); a slope is a drift (more distinct prefixes, a fuller pool).",
            targets=[self.target(self.ratio("model_name"), "{{model_name}}", "A")],
            unit="percentunit", valueMin=0, valueMax=1, thresholdsStyleMode="line",
            thresholds=[g.Threshold("red", 0, 0.0), g.Threshold("green", 1, THRESHOLD)]),
            x, y, w, h)

    def hit_rate_vs_ttft(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        overrides = [{"matcher": {"id": "byRegexp", "options": "TTFT.*"},
                      "properties": [{"id": "custom.axisPlacement", "value": "right"},
                                     {"id": "unit", "value": "s"},
                                     {"id": "min", "value": 0}]}]
        self.add(g.TimeSeries(
            title="Hit rate and TTFT",
            description="Hit rate (left axis) against TTFT p50/p95 (right axis). They should "
                        "mirror each other: when the hit rate falls, TTFT rises. If the hit "
                        "rate moves and TTFT does not, the cache or the routing is "
                        "misconfigured.",
            targets=[self.target(self.ratio("model_name"), "hit rate {{model_name}}", "A"),
                     self.target(self.quantile("0.5", self.s.ttft_bucket),
                                 "TTFT p50 {{model_name}}", "B"),
                     self.target(self.quantile("0.95", self.s.ttft_bucket),
                                 "TTFT p95 {{model_name}}", "C")],
            unit="percentunit", valueMin=0, overrides=overrides), x, y, w, h)

    def cached_vs_computed(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        cached = f"sum ({self.rate(self.s.hits)})"
        computed = f"sum ({self.rate(self.s.queries)})\n-\nsum ({self.rate(self.s.hits)})"
        self.add(g.TimeSeries(
            title="Prompt tokens: cached vs computed",
            description="Prompt tokens per second served from cache (saved) and prefilled "
                        "(computed), stacked: the top of the stack is the prompt load. A "
                        "growing computed band at the same load is a falling hit rate.",
            targets=[self.target(cached, "cached", "A"), self.target(computed, "computed", "B")],
            unit="short", stacking={"mode": "normal", "group": "A"}, fillOpacity=40),
            x, y, w, h)

    def per_replica(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        by = f"model_name, {self.s.replica}"
        self.add(g.TimeSeries(
            title="Hit rate per replica",
            description="Each replica's hit rate. One far below its peers points at routing "
                        "(round-robin spreads each prefix over every replica) or at eviction "
                        "on that node; see PrefixCacheReplicaOutlier.",
            targets=[self.target(self.ratio(by), f"{{{{{self.s.replica}}}}} {{{{model_name}}}}",
                                 "A")],
            unit="percentunit", valueMin=0, valueMax=1, thresholdsStyleMode="line",
            thresholds=[g.Threshold("red", 0, 0.0), g.Threshold("green", 1, THRESHOLD)]),
            x, y, w, h)

    def kv_and_preemptions(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        overrides = [{"matcher": {"id": "byRegexp", "options": "preemptions.*"},
                      "properties": [{"id": "custom.axisPlacement", "value": "right"},
                                     {"id": "unit", "value": "short"},
                                     {"id": "custom.drawStyle", "value": "bars"}]}]
        self.add(g.TimeSeries(
            title="KV-cache usage and preemptions",
            description="KV-cache pool usage per replica (left) and preemptions per second "
                        "(right). Usage near 100% with preemptions means cached prefixes are "
                        "evicted before reuse: see PrefixCacheEvictionPressure.",
            targets=[self.target(f"max by ({self.s.replica}) ({self.sel(self.s.kv_usage)})",
                                 f"usage {{{{{self.s.replica}}}}}", "A"),
                     self.target(f"sum by ({self.s.replica}) ({self.rate(self.s.preemptions)})",
                                 f"preemptions {{{{{self.s.replica}}}}}", "B")],
            unit="percentunit", valueMin=0, overrides=overrides), x, y, w, h)

    def prompt_length(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        self.add(g.TimeSeries(
            title="Prompt length p50 vs p99",
            description="Prompt tokens per request. Prompts under one block (16 tokens) can "
                        "never hit; a p99 far above the p50 means prompts share little, so the "
                        "cache cannot help much.",
            targets=[self.target(self.quantile("0.5", self.s.prompt_len_bucket),
                                 "p50 {{model_name}}", "A"),
                     self.target(self.quantile("0.99", self.s.prompt_len_bucket),
                                 "p99 {{model_name}}", "B")],
            unit="short"), x, y, w, h)

    def external_cache(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        ratio = (f"sum ({self.rate(self.s.ext_hits)})\n/\n"
                 f"(sum ({self.rate(self.s.ext_queries)}) > 0)")
        overrides = [{"matcher": {"id": "byName", "options": "external queries"},
                      "properties": [{"id": "custom.axisPlacement", "value": "right"},
                                     {"id": "unit", "value": "short"}]}]
        self.add(g.TimeSeries(
            title="External (KV connector) cache",
            description="Hit rate of an external KV cache (LMCache, NIXL, ... through vLLM's "
                        "KV connector) and the tokens per second looked up there. Without a "
                        "connector the lookups stay at 0 and there is no hit rate to show.",
            targets=[self.target(ratio, "external hit rate", "A"),
                     self.target(f"sum ({self.rate(self.s.ext_queries)})", "external queries",
                                 "B")],
            unit="percentunit", valueMin=0, overrides=overrides), x, y, w, h)

    def requests(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        self.add(g.TimeSeries(
            title="Requests running and waiting",
            description="Requests in the running batch and in the queue. A queue that grows "
                        "while the hit rate falls is prefill work the cache no longer saves.",
            targets=[self.target(f"sum ({self.sel(self.s.running)})", "running", "A"),
                     self.target(f"sum ({self.sel(self.s.waiting)})", "waiting", "B")],
            unit="short"), x, y, w, h)

    def why_low(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        diag = f'{names.OUT_DIAGNOSIS.name}{{job=~"$job",model_name=~"$model"}}'
        self.add(g.StateTimeline(
            title="Why is it low?",
            description="The exporter's diagnosis: each cause of a low hit rate, red while it "
                        "holds on any replica of the selected models (prefixwatch_diagnosis). "
                        "prefix_divergence and routing_spread need the exporter's "
                        "--requests-log. Every cause has a runbook section: "
                        f"{RUNBOOK_URL}#diagnosis",
            targets=[self.target(f"max by (cause) ({diag})", "{{cause}}", "A")],
            mappings=[{"type": "value", "options": {
                "0": {"text": "no", "color": "green", "index": 0},
                "1": {"text": "yes", "color": "red", "index": 1}}}],
            thresholds=[g.Threshold("green", 0, 0.0), g.Threshold("red", 1, 1.0)],
            showValue="never", mergeValues=True), x, y, w, h)

    def achievable_vs_achieved(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        achieved = f'{rules.r_ratio(rules.MODEL, "5m")}{{model_name=~"$model"}}'
        achievable = f'{rules.R_ACHIEVABLE}{{model_name=~"$model"}}'
        self.add(g.TimeSeries(
            title="Achievable vs achieved hit rate",
            description="Achieved: the fleet's hit rate (5m). Achievable: what an unlimited "
                        "cache would have served of the same requests (the exporter's "
                        "--requests-log, vLLM's caching rule). Both low: the prompts differ "
                        "near the top (prefix_divergence; run `prefixwatch audit`). Achievable "
                        "high, achieved low: the cache forgot (eviction_pressure) or the "
                        "traffic is spread over replicas (routing_spread).",
            targets=[self.target(achieved, "achieved {{model_name}}", "A"),
                     self.target(achievable, "achievable {{model_name}}", "B")],
            unit="percentunit", valueMin=0, valueMax=1, thresholdsStyleMode="line",
            thresholds=[g.Threshold("red", 0, 0.0), g.Threshold("green", 1, THRESHOLD)]),
            x, y, w, h)

    def capacity(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        served = f'{rules.r_hits(rules.MODEL, "5m")}{{model_name=~"$model"}}'
        missed = f'{rules.R_MISSED}{{model_name=~"$model"}}'
        saved = f'{rules.R_SAVED_SHARE}{{model_name=~"$model"}}'
        overrides = [{"matcher": {"id": "byRegexp", "options": "share saved.*"},
                      "properties": [{"id": "custom.axisPlacement", "value": "right"},
                                     {"id": "unit", "value": "percentunit"},
                                     {"id": "min", "value": 0}, {"id": "max", "value": 1}]}]
        self.add(g.TimeSeries(
            title="Capacity: prefill served by cache, and what more was achievable",
            description="Arithmetic you can check (5m rates, recording rules in "
                        "alerts/): served = Δhits/Δt, prompt tokens per second the prefix "
                        "cache served instead of prefilling; recomputable = (achievable − "
                        "achieved) × Δqueries/Δt, prefill tokens per second recomputed that an "
                        "unlimited cache would have served (needs --requests-log); share saved "
                        "= Δcached prompt tokens / Δprompt tokens (right axis), the share of "
                        "prefill work the caches saved. Divide tokens/s by one GPU's prefill "
                        "throughput for GPUs' worth of prefill.",
            targets=[self.target(served, "served from cache {{model_name}}", "A"),
                     self.target(missed, "recomputable {{model_name}}", "B"),
                     self.target(saved, "share saved {{model_name}}", "C")],
            unit="short", valueMin=0, overrides=overrides), x, y, w, h)

    def scrape_health(self, x: int, y: int, w: int = 12, h: int = 8) -> None:
        if self.s.source == "exporter":
            replica = ',target=~"$instance"' if self.one else ""
            targets = [
                self.target(f'{names.OUT_TARGET_UP.name}{{job=~"$job"{replica}}}',
                            "up {{target}}", "A"),
                self.target(f'sum by (reason) (rate({names.OUT_SCRAPE_ERRORS.name}_total'
                            f'{{job=~"$job"{replica}}}[$__rate_interval]))',
                            "errors: {{reason}}", "B")]
            text = ("Whether the exporter can read each vLLM target (1 = up), and why not when "
                    "it cannot (connect, timeout, http_status, parse, ...). Without data here "
                    "the other panels and the alerts are blind: see PrefixCacheMetricsAbsent.")
        else:
            replica = ',instance=~"$instance"' if self.one else ""
            targets = [self.target(f'up{{job=~"$job"{replica}}}', "up {{instance}}", "A"),
                       self.target(f'scrape_duration_seconds{{job=~"$job"{replica}}}',
                                   "scrape seconds {{instance}}", "B")]
            text = ("Whether Prometheus can scrape each vLLM server (1 = up) and how long a "
                    "scrape takes. Without data here the other panels and the alerts are "
                    "blind: see PrefixCacheMetricsAbsent.")
        self.add(g.TimeSeries(title="Targets up and scrape errors", description=text,
                              targets=targets, unit="short", valueMin=0), x, y, w, h)


def _templating(s: Series, one_replica: bool) -> g.Templating:
    ds = {"type": "prometheus", "uid": "${datasource}"}
    return g.Templating(list=[
        g.Template(name="datasource", label="Data source", query="prometheus",
                   type="datasource", default="Prometheus", hide=0),
        g.Template(name="job", label="Job", dataSource=ds, type="query",
                   query=f"label_values({s.base}, job)", includeAll=True, multi=True,
                   allValue=".*", refresh=2, sort=1, default="$__all"),
        g.Template(name="model", label="Model", dataSource=ds, type="query",
                   query=f'label_values({s.base}{{job=~"$job"}}, model_name)', includeAll=True,
                   multi=not one_replica, allValue=".*", refresh=2, sort=1, default="$__all"),
        g.Template(name="instance", label="Replica", dataSource=ds, type="query",
                   query=f'label_values({s.base}{{job=~"$job",model_name=~"$model"}}, '
                         f'{s.replica})',
                   includeAll=not one_replica, multi=not one_replica, allValue=".*", refresh=2,
                   sort=1, default="" if one_replica else "$__all"),
    ])


def _links() -> list[g.DashboardLink]:
    return [
        g.DashboardLink(title="Runbooks", uri=RUNBOOK_URL, type="link", icon="doc",
                        targetBlank=True, tooltip="What each alert means and how to fix it"),
        g.DashboardLink(title="prefixwatch dashboards", type="dashboards", tags=["prefixwatch"],
                        asDropdown=True, includeVars=True, keepTime=True),
    ]


def overview(source: str = "exporter") -> g.Dashboard:
    s = series_for(source)
    p = Panels(s, one_replica=False)
    p.hit_rate_now(0, 0)
    p.ttft_now(6, 0)
    p.tokens_saved(12, 0)
    p.firing_alerts(18, 0)
    p.hit_rate_over_time(0, 5)
    p.hit_rate_vs_ttft(12, 5)
    p.cached_vs_computed(0, 13)
    p.per_replica(12, 13)
    p.kv_and_preemptions(0, 21)
    p.prompt_length(12, 21)
    if source == "exporter":
        p.why_low(0, 29)
        p.achievable_vs_achieved(12, 29)
        p.capacity(0, 37)
        p.external_cache(12, 37)
        p.scrape_health(0, 45, w=24)
    else:
        p.capacity(0, 29)
        p.external_cache(12, 29)
        p.scrape_health(0, 37, w=24)
    return _dashboard("overview", "Prefix cache overview", source, p,
                      "Is the prefix cache working, since when not, on which model and "
                      "replica, and what it costs in TTFT.")


def replica(source: str = "exporter") -> g.Dashboard:
    s = series_for(source)
    p = Panels(s, one_replica=True)
    p.hit_rate_now(0, 0, w=8)
    p.ttft_now(8, 0, w=8)
    p.tokens_saved(16, 0, w=8)
    p.hit_rate_vs_ttft(0, 5, w=24)
    p.cached_vs_computed(0, 13)
    p.kv_and_preemptions(12, 13)
    p.prompt_length(0, 21)
    p.requests(12, 21)
    p.external_cache(0, 29)
    p.scrape_health(12, 29)
    return _dashboard("replica", "Replica drill-down", source, p,
                      "The prefix-cache signals of one replica, chosen with the Replica "
                      "variable.")


def _dashboard(kind: str, title: str, source: str, panels: Panels,
               description: str) -> g.Dashboard:
    suffix = "" if source == "exporter" else f" ({source} series)"
    return g.Dashboard(
        title=f"prefixwatch / {title}{suffix}",
        uid=f"prefixwatch-{kind}{'' if source == 'exporter' else '-' + source}",
        description=description, tags=["prefixwatch", "vllm", "prefix-cache"],
        panels=panels.panels, links=_links(),
        templating=_templating(panels.s, one_replica=panels.one), refresh="30s",
        time=g.Time("now-3h", "now"), timezone="browser", graphTooltip=1)


# -- JSON ---------------------------------------------------------------------------------------

_LEGACY_DASHBOARD_KEYS = {"rows", "hideControls", "sharedCrosshair", "style", "inputs",
                          "__inputs", "gnetId", "id", "annotations"}
_LEGACY_PANEL_KEYS = {"cacheTimeout", "error", "height", "hideTimeOverride", "minSpan", "span",
                      "repeatDirection", "maxPerRow", "editable", "thresholdType",
                      "maxDataPoints", "timeFrom", "timeShift", "repeat"}
_LEGACY_TARGET_KEYS = {"query", "target", "metric", "step", "intervalFactor", "interval",
                       "hide", "instant", "format"}


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items()
                if v is not None and not (isinstance(v, str) and v == "null")}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def normalize(dashboard: dict[str, Any]) -> dict[str, Any]:
    """grafanalib's JSON, brought to Grafana's current schema (see module docstring)."""
    out = {k: v for k, v in dashboard.items() if k not in _LEGACY_DASHBOARD_KEYS}
    out["schemaVersion"] = SCHEMA_VERSION
    out["version"] = 1
    out["editable"] = True
    panels = []
    for panel in out.get("panels", []):
        panel = {k: v for k, v in panel.items() if k not in _LEGACY_PANEL_KEYS}
        panel["targets"] = [{k: v for k, v in t.items() if k not in _LEGACY_TARGET_KEYS}
                            for t in panel.get("targets", [])]
        defaults = panel.get("fieldConfig", {}).get("defaults", {})
        steps = defaults.get("thresholds", {}).get("steps", [])
        if steps:
            defaults["thresholds"]["steps"] = [
                {"color": st["color"], "value": None if i == 0 else st["value"]}
                for i, st in enumerate(steps)]
        if panel.get("transformations") == []:
            del panel["transformations"]
        if panel.get("links") == []:
            del panel["links"]
        panels.append(panel)
    out["panels"] = panels
    out.get("timepicker", {}).pop("time_options", None)
    for var in out.get("templating", {}).get("list", []):
        if isinstance(var.get("current"), dict):
            var["current"].pop("tags", None)
            if var["current"].get("value") == "$__all":
                var["current"]["text"] = "All"
        for key in ("tagValuesQuery", "tagsQuery", "useTags", "auto", "auto_count", "auto_min",
                    "datasource" if var.get("type") == "datasource" else "_"):
            var.pop(key, None)
    steps_kept: dict[int, list] = {}
    for i, panel in enumerate(out["panels"]):
        steps_kept[i] = panel.get("fieldConfig", {}).get("defaults", {}).get(
            "thresholds", {}).get("steps", [])
    cleaned = _drop_nulls(out)
    # The base threshold step's value is a real JSON null in Grafana's schema: put it back.
    for i, panel in enumerate(cleaned["panels"]):
        if steps_kept[i]:
            panel["fieldConfig"]["defaults"]["thresholds"]["steps"] = steps_kept[i]
    return cleaned


def to_json(dashboard: g.Dashboard) -> str:
    data = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
    return json.dumps(normalize(data), indent=2, sort_keys=True) + "\n"


def all_dashboards(source: str = "exporter") -> dict[str, g.Dashboard]:
    return {f"prefixwatch-overview{'' if source == 'exporter' else '-' + source}.json":
            overview(source),
            f"prefixwatch-replica{'' if source == 'exporter' else '-' + source}.json":
            replica(source)}


def write(directory: Path, source: str = "exporter", datasource_uid: str | None = None
          ) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, dashboard in all_dashboards(source).items():
        text = to_json(dashboard)
        if datasource_uid:
            data = json.loads(text)
            for var in data["templating"]["list"]:
                if var["name"] == "datasource":
                    var["current"] = {"text": datasource_uid, "value": datasource_uid}
            text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        path = directory / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    return written


def queries(dashboard_json: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query in a dashboard's JSON."""
    return [(p["title"], t["expr"]) for p in dashboard_json["panels"]
            for t in p.get("targets", [])]
