"""Prometheus recording and alerting rules, generated from core's metric names.

Recorded series have the same names whatever the source (the exporter's ``prefixwatch_*``
series, or vLLM's / SGLang's own series scraped directly), so alerts and dashboards are
written once. Per-replica series carry a ``target`` label: the exporter's own, or a copy of
``instance`` when Prometheus scrapes the engines directly.

Hit ratios are always ``sum(rate(hits)) / sum(rate(queries))`` (never an average of ratios),
and are absent, not NaN, when there was no traffic.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from prefixwatch.core import names, schemas
from prefixwatch.core.windows import parse_duration

SOURCES = ("exporter", "vllm", "sglang")
DEFAULT_RUNBOOK_URL = "https://github.com/prefixwatch/prefixwatch/blob/main/docs/runbooks.md"


class RulesConfigError(ValueError):
    pass


_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")


def promql_regex_literal(values: list[str]) -> str:
    """An alternation matching exactly these values, as the body of a PromQL string."""
    def one(value: str) -> str:
        out = []
        for ch in value:
            if ch in _REGEX_SPECIAL:
                out.append("\\\\" + ch)  # a backslash for the regex, escaped for PromQL
            elif ch == '"':
                out.append('\\"')
            else:
                out.append(ch)
        return "".join(out)
    return "|".join(one(v) for v in values)


def promql_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class RuleSource:
    """Raw series names of one source, by role."""

    name: str
    queries: str
    hits: str
    replica_label: str  # label that names a replica on the raw series
    ttft_bucket: str | None
    prompt_len_bucket: str | None
    kv_usage: str | None
    preemptions: str | None
    waiting: str | None
    prompt_tokens: str | None
    prompt_tokens_cached: str | None
    target_up: str | None  # the exporter's per-target up
    liveness: str  # a series whose absence means "no data at all"


def _source(name: str) -> RuleSource:
    if name == "exporter":
        return RuleSource(
            name, queries=names.OUT_QUERIES.name + "_total",
            hits=names.OUT_HITS.name + "_total", replica_label=names.L_TARGET,
            ttft_bucket=names.OUT_TTFT.name + "_bucket",
            prompt_len_bucket=names.OUT_PROMPT_LEN.name + "_bucket",
            kv_usage=names.OUT_KV_USAGE.name, preemptions=names.OUT_PREEMPTIONS.name + "_total",
            waiting=names.OUT_WAITING.name,
            prompt_tokens=names.OUT_PROMPT_TOKENS.name + "_total",
            prompt_tokens_cached=names.OUT_PROMPT_TOKENS_CACHED.name + "_total",
            target_up=names.OUT_TARGET_UP.name,
            liveness=names.OUT_BUILD_INFO.name + "_info")
    schema = {"vllm": schemas.VLLM_V1, "sglang": schemas.SGLANG}.get(name)
    if schema is None:
        raise RulesConfigError(f"unknown source {name!r}; one of {', '.join(SOURCES)}")
    assert schema.queries and schema.hits
    return RuleSource(
        name, queries=schema.queries, hits=schema.hits, replica_label="instance",
        ttft_bucket=schema.ttft + "_bucket" if schema.ttft else None,
        prompt_len_bucket=schema.prompt_len + "_bucket" if schema.prompt_len else None,
        kv_usage=schema.kv_usage, preemptions=schema.preemptions, waiting=schema.waiting,
        prompt_tokens=schema.prompt_tokens, prompt_tokens_cached=schema.prompt_tokens_cached,
        target_up=None, liveness=schema.queries)


@dataclass(frozen=True)
class ModelOverride:
    threshold: float | None = None
    disabled: bool = False


@dataclass(frozen=True)
class RulesConfig:
    """Everything a user may tune; the defaults are the documented ones."""

    threshold: float = names.DEFAULT_HIT_RATIO_THRESHOLD
    #: Prompt tokens per second (per model) below which no hit-rate alert fires.
    min_query_tokens_per_second: float = 100.0
    regression_drop: float = 0.15
    outlier_gap: float = 0.25
    kv_usage_high: float = 0.90
    #: A model whose counters reset within this long is warming up: no hit-rate alert.
    cold_start: str = "10m"
    selector: str = ""
    evaluation_interval: str = "15s"
    #: Multiplies every window and `for` (tests run the same rules in seconds).
    time_scale: float = 1.0
    runbook_url: str = DEFAULT_RUNBOOK_URL
    models: dict[str, ModelOverride] = field(default_factory=dict)

    def scaled(self, duration: str) -> str:
        return prom_duration(parse_duration(duration) * self.time_scale)


_CONFIG_KEYS = {"threshold", "min_query_tokens_per_second", "regression_drop", "outlier_gap",
                "kv_usage_high", "cold_start", "selector", "evaluation_interval", "time_scale",
                "runbook_url", "models"}


def load_config(path: str | None, threshold: float | None = None) -> RulesConfig:
    data: dict[str, Any] = {}
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise RulesConfigError(f"cannot read {path!r}: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise RulesConfigError(f"{path!r} is not valid YAML") from exc
        if not isinstance(data, dict):
            raise RulesConfigError(f"{path!r} must hold a mapping")
        unknown = set(data) - _CONFIG_KEYS
        if unknown:
            raise RulesConfigError(f"{path!r}: unknown key {sorted(unknown)[0]!r}")
    models: dict[str, ModelOverride] = {}
    for model, spec in (data.pop("models", None) or {}).items():
        if not isinstance(spec, dict) or set(spec) - {"threshold", "disabled"}:
            raise RulesConfigError(f"models.{model}: use threshold: and/or disabled:")
        models[str(model)] = ModelOverride(
            threshold=None if spec.get("threshold") is None else float(spec["threshold"]),
            disabled=bool(spec.get("disabled", False)))
    if threshold is not None:
        data["threshold"] = threshold
    try:
        cfg = RulesConfig(models=models, **data)
        for key in ("cold_start", "evaluation_interval"):
            parse_duration(getattr(cfg, key))
    except (TypeError, ValueError) as exc:
        raise RulesConfigError(str(exc)) from exc
    for name, value in (("threshold", cfg.threshold), ("regression_drop", cfg.regression_drop),
                        ("outlier_gap", cfg.outlier_gap), ("kv_usage_high", cfg.kv_usage_high)):
        if not 0 < value < 1:
            raise RulesConfigError(f"{name} must be between 0 and 1, not {value}")
    for model, override in models.items():
        if override.threshold is not None and not 0 < override.threshold < 1:
            raise RulesConfigError(f"models.{model}.threshold must be between 0 and 1")
    if cfg.time_scale <= 0 or cfg.min_query_tokens_per_second < 0:
        raise RulesConfigError("time_scale must be > 0 and min_query_tokens_per_second >= 0")
    if cfg.selector and not re.fullmatch(r'\s*[a-zA-Z_]\w*\s*(=|!=|=~|!~)\s*".*"\s*', cfg.selector
                                         .split(",")[0]):
        raise RulesConfigError('selector must look like job="vllm",namespace="prod"')
    return cfg


def prom_duration(seconds: float) -> str:
    """Seconds as a Prometheus duration ('1h30m', '45s', '500ms')."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError("duration must be positive")
    out = ""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return out


# Recorded series names (level:metric:operations). Dashboards import these too.
def r_queries(level: str, w: str) -> str:
    return f"{level}:prefix_cache_queries:rate{w}"


def r_hits(level: str, w: str) -> str:
    return f"{level}:prefix_cache_hits:rate{w}"


def r_ratio(level: str, w: str) -> str:
    return f"{level}:prefix_cache_hit_ratio:rate{w}"


MODEL = "model_name"
MODEL_TARGET = "model_name_target"
R_BASELINE = "model_name:prefix_cache_hit_ratio:rate2h_offset1h"
R_RESETS = "model_name:prefix_cache_queries:resets"
R_TTFT = "model_name_quantile:time_to_first_token_seconds:rate5m"
R_TTFT_TARGET = "model_name_target_quantile:time_to_first_token_seconds:rate5m"
R_PROMPT_LEN = "model_name_quantile:request_prompt_tokens:rate5m"
R_KV = "model_name_target:kv_cache_usage:max5m"
R_PREEMPT = "model_name_target:preemptions:rate5m"
R_WAITING = "model_name_target:requests_waiting:max5m"
# Capacity and cost (the dashboard's arithmetic, recorded so it can be checked and reused).
R_SAVED_SHARE = "model_name:prefill_tokens_saved:ratio_rate5m"
R_ACHIEVABLE = "model_name:prefix_cache_achievable_hit_ratio:max"
R_MISSED = "model_name:prefill_tokens_achievable_missed:rate5m"
RATIO_WINDOWS = ("1m", "5m", "15m", "1h")
TARGET_WINDOWS = ("5m", "15m")

NO_DIAGNOSIS = ("none (no prefixwatch_diagnosis is 1 for this model: a cause outside the "
                "runbook, or the exporter is not scraped).")


def render_diagnosis(causes: list[str], runbook_url: str) -> str:
    """What ``Builder.diagnosis_clause`` renders to, for the promtool tests' expectations."""
    named = "; ".join(f"{c} ({runbook_url}#{c})" for c in sorted(set(causes)))
    return " Diagnosis: " + (named or NO_DIAGNOSIS)


ALERT_LOW = "PrefixCacheHitRateLow"
ALERT_REGRESSION = "PrefixCacheHitRateRegression"
ALERT_OUTLIER = "PrefixCacheReplicaOutlier"
ALERT_EVICTION = "PrefixCacheEvictionPressure"
ALERT_ABSENT = "PrefixCacheMetricsAbsent"
ALERT_WATCHDOG = "Watchdog"
ALERTS = (ALERT_LOW, ALERT_REGRESSION, ALERT_OUTLIER, ALERT_EVICTION, ALERT_ABSENT,
          ALERT_WATCHDOG)


class Builder:
    def __init__(self, source: str, cfg: RulesConfig) -> None:
        self.src = _source(source)
        self.cfg = cfg

    def sel(self, metric: str) -> str:
        return f"{metric}{{{self.cfg.selector}}}" if self.cfg.selector else metric

    def w(self, window: str) -> str:
        return self.cfg.scaled(window)

    def by_target(self, expr: str, *extra: str) -> str:
        """Aggregate by model and replica, naming the replica `target` whatever the source."""
        labels = ", ".join((MODEL, "target", *extra))
        if self.src.replica_label != "target":
            expr = f'label_replace({expr}, "target", "$1", "{self.src.replica_label}", "(.*)")'
        return f"sum by ({labels}) ({expr})"

    # -- recording rules -----------------------------------------------------------------------

    def recording(self) -> list[dict[str, Any]]:
        s, rules = self.src, []

        def rec(name: str, expr: str) -> None:
            rules.append({"record": name, "expr": expr})

        for w in RATIO_WINDOWS:
            rec(r_queries(MODEL, w), f"sum by ({MODEL}) (rate({self.sel(s.queries)}[{self.w(w)}]))")
            rec(r_hits(MODEL, w), f"sum by ({MODEL}) (rate({self.sel(s.hits)}[{self.w(w)}]))")
            rec(r_ratio(MODEL, w), f"{r_hits(MODEL, w)} / ({r_queries(MODEL, w)} > 0)")
        for w in TARGET_WINDOWS:
            rec(r_queries(MODEL_TARGET, w),
                self.by_target(f"rate({self.sel(s.queries)}[{self.w(w)}])"))
            rec(r_hits(MODEL_TARGET, w), self.by_target(f"rate({self.sel(s.hits)}[{self.w(w)}])"))
            rec(r_ratio(MODEL_TARGET, w),
                f"{r_hits(MODEL_TARGET, w)} / ({r_queries(MODEL_TARGET, w)} > 0)")
        base, offset = self.w("2h"), self.w("1h")
        rec(R_BASELINE,
            f"sum by ({MODEL}) (rate({self.sel(s.hits)}[{base}] offset {offset}))\n"
            f"/\n(sum by ({MODEL}) (rate({self.sel(s.queries)}[{base}] offset {offset})) > 0)")
        cold = self.w(self.cfg.cold_start)
        rec(R_RESETS, f"max by ({MODEL}) (resets({self.sel(s.queries)}[{cold}]))")
        for name, bucket, quantiles, per_target in (
                (R_TTFT, s.ttft_bucket, ("0.5", "0.95", "0.99"), False),
                (R_TTFT_TARGET, s.ttft_bucket, ("0.5", "0.95"), True),
                (R_PROMPT_LEN, s.prompt_len_bucket, ("0.5", "0.99"), False)):
            if bucket is None:
                continue
            rate = f"rate({self.sel(bucket)}[{self.w('5m')}])"
            agg = self.by_target(rate, "le") if per_target else f"sum by ({MODEL}, le) ({rate})"
            parts = [f'label_replace(histogram_quantile({q}, {agg}), "quantile", "{q}", "", "")'
                     for q in quantiles]
            rec(name, "\nor\n".join(parts))
        if s.kv_usage:
            gauge = f"max_over_time({self.sel(s.kv_usage)}[{self.w('5m')}])"
            rec(R_KV, self.by_target(gauge).replace("sum by", "max by", 1))
        if s.preemptions:
            rec(R_PREEMPT, self.by_target(f"rate({self.sel(s.preemptions)}[{self.w('5m')}])"))
        if s.waiting:
            gauge = f"max_over_time({self.sel(s.waiting)}[{self.w('5m')}])"
            rec(R_WAITING, self.by_target(gauge))
        # Capacity and cost: the share of prefill work the caches saved, and the prefill
        # tokens per second recomputed that an unlimited cache could have served (the
        # exporter's achievable ratio, from a requests log, minus the achieved one).
        if s.prompt_tokens and s.prompt_tokens_cached:
            w5 = self.w("5m")
            rec(R_SAVED_SHARE,
                f"sum by ({MODEL}) (rate({self.sel(s.prompt_tokens_cached)}[{w5}]))\n/\n"
                f"(sum by ({MODEL}) (rate({self.sel(s.prompt_tokens)}[{w5}])) > 0)")
        rec(R_ACHIEVABLE, f"max by ({MODEL}) ({names.OUT_ACHIEVABLE.name})")
        rec(R_MISSED,
            f"clamp_min({R_ACHIEVABLE} - on ({MODEL}) {r_ratio(MODEL, '5m')}, 0)\n"
            f"* on ({MODEL}) {r_queries(MODEL, '5m')}")
        return rules

    # -- alerts --------------------------------------------------------------------------------

    def below_threshold(self, series: str) -> str:
        """`series < threshold`, with per-model thresholds and opt-outs."""
        special = {m: o for m, o in self.cfg.models.items()}
        clauses = []
        excluded = promql_regex_literal(sorted(special))
        default = f'{series}{{{MODEL}!~"{excluded}"}}' if excluded else series
        clauses.append(f"{default} < {self.cfg.threshold:g}")
        for model, override in sorted(special.items()):
            if override.disabled:
                continue
            value = override.threshold if override.threshold is not None else self.cfg.threshold
            clauses.append(f'{series}{{{MODEL}="{promql_string(model)}"}} < {value:g}')
        return clauses[0] if len(clauses) == 1 else "(" + " or ".join(clauses) + ")"

    def enabled(self, series: str) -> str:
        off = [m for m, o in self.cfg.models.items() if o.disabled]
        if not off:
            return series
        return f'{series}{{{MODEL}!~"{promql_regex_literal(sorted(off))}"}}'

    def guards(self, window: str) -> str:
        """Enough traffic, and not a cold cache after a restart."""
        return (f"and on ({MODEL}) {r_queries(MODEL, window)} > "
                f"{self.cfg.min_query_tokens_per_second:g}\n"
                f"unless on ({MODEL}) {R_RESETS} > 0")

    def runbook(self, anchor: str) -> str:
        return f"{self.cfg.runbook_url}#{anchor.lower()}"

    def diagnosis_clause(self) -> str:
        """Template text naming the causes the exporter diagnoses for the alert's model, each
        with its runbook section (a query at notification time: the alert's labels stay
        stable while the causes change)."""
        diag = names.OUT_DIAGNOSIS.name
        query = (f'printf "count by (cause) ({diag}{{model_name=%q}} == 1)" '
                 "$labels.model_name")
        return (" Diagnosis: {{ range $i, $s := query (" + query + ") | sortByLabel \"cause\" }}"
                "{{ if $i }}; {{ end }}{{ $s.Labels.cause }} (" + self.cfg.runbook_url +
                "#{{ $s.Labels.cause }}){{ else }}" + NO_DIAGNOSIS + "{{ end }}")

    def alert(self, name: str, expr: str, for_: str | None, severity: str, summary: str,
              description: str, anchor: str | None = None) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": name, "expr": expr}
        if for_:
            rule["for"] = self.w(for_)
        rule["labels"] = {"severity": severity}
        rule["annotations"] = {"summary": summary, "description": description,
                               "runbook_url": self.runbook(anchor or name)}
        return rule

    def alerts(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        pct = "{{ $value | humanizePercentage }}"
        model = "{{ $labels.model_name }}"
        out = [
            self.alert(
                ALERT_LOW,
                f"{self.below_threshold(r_ratio(MODEL, '1m'))}\n"
                f"and on ({MODEL}) {self.below_threshold(r_ratio(MODEL, '5m'))}\n"
                f"{self.guards('5m')}",
                "2m", "critical",
                f"Prefix-cache hit rate of {model} collapsed to {pct}.",
                f"The prefix-cache hit rate of {model} is {pct} over the last minute and below "
                f"{cfg.threshold:.0%} over five minutes. Prompts are recomputed from scratch: "
                "TTFT and GPU load go up. Usually something now changes near the top of the "
                "prompt (a timestamp, an id, tool order)." + self.diagnosis_clause(),
            ),
            self.alert(
                ALERT_LOW,
                f"{self.below_threshold(r_ratio(MODEL, '15m'))}\n{self.guards('15m')}",
                "15m", "warning",
                f"Prefix-cache hit rate of {model} is low ({pct}).",
                f"The prefix-cache hit rate of {model} has been below {cfg.threshold:.0%} for "
                f"15 minutes ({pct} now, over 15 minutes). A slow drift: more distinct prefixes, "
                "a fuller KV pool, or a prompt change rolled out gradually."
                + self.diagnosis_clause(),
            ),
            self.alert(
                ALERT_REGRESSION,
                f"{self.enabled(r_ratio(MODEL, '15m'))}\n< on ({MODEL})\n"
                f"{R_BASELINE} - {cfg.regression_drop:g}\n{self.guards('15m')}",
                "10m", "warning",
                f"Prefix-cache hit rate of {model} regressed to {pct}.",
                f"The prefix-cache hit rate of {model} is {pct} over 15 minutes, "
                f"{cfg.regression_drop:.0%} or more below its own level one to three hours ago "
                "(it may still be above the alert threshold). Check what was deployed."
                + self.diagnosis_clause(),
            ),
            self.alert(
                ALERT_OUTLIER,
                f"{self.enabled(r_ratio(MODEL_TARGET, '15m'))}\n< on ({MODEL}) group_left ()\n"
                f"({r_ratio(MODEL, '15m')} - {cfg.outlier_gap:g})\n"
                f"and on ({MODEL}, target) {r_queries(MODEL_TARGET, '15m')} > "
                f"{cfg.min_query_tokens_per_second:g}\n"
                f"and on ({MODEL}) count by ({MODEL}) ({r_queries(MODEL_TARGET, '15m')}) > 1",
                "15m", "warning",
                f"Replica {{{{ $labels.target }}}} of {model} has a low hit rate ({pct}).",
                f"Replica {{{{ $labels.target }}}} serves {model} with a prefix-cache hit rate "
                f"of {pct}, more than {cfg.outlier_gap:.0%} below the model's fleet. Routing "
                "sends it prefixes the others hold (round-robin), or its pool is evicting."
                + self.diagnosis_clause(),
            ),
        ]
        evict_extra = (f"and on ({MODEL}, target) {R_PREEMPT} > 0" if self.src.preemptions
                       else f"and on ({MODEL}, target) {R_WAITING} > 0")
        if self.src.kv_usage:
            out.append(self.alert(
                ALERT_EVICTION,
                f"{R_KV} > {cfg.kv_usage_high:g}\n{evict_extra}",
                "10m", "warning",
                f"KV-cache pool of {{{{ $labels.target }}}} ({model}) is full and evicting.",
                f"KV-cache usage on {{{{ $labels.target }}}} ({model}) is {pct} with requests "
                "preempted or queued: cached prefixes are evicted before they can be reused.",
            ))
        out.append(self.alert(ALERT_ABSENT, self.absent_expr(), "5m", "warning",
                              "Prefix-cache metrics are missing"
                              "{{ if $labels.target }} for {{ $labels.target }}{{ end }}.",
                              "No prefix-cache series (or the target is down), so the hit-rate "
                              "alerts cannot fire. Check the exporter and the vLLM /metrics "
                              "endpoint."))
        out.append({"alert": ALERT_WATCHDOG, "expr": "vector(1)",
                    "labels": {"severity": "none"},
                    "annotations": {
                        "summary": "Always firing: proves the alerting pipeline works.",
                        "description": "A dead man's switch. If its notifications stop, "
                                       "Prometheus or Alertmanager is broken.",
                        "runbook_url": self.runbook(ALERT_WATCHDOG)}})
        return out

    def absent_expr(self) -> str:
        """A model whose series vanished, a target that is down, or no data at all."""
        s = self.src
        recent = f"last_over_time({self.sel(s.queries)}[{self.w('1h')}])"
        parts = [f"max by ({MODEL}) ({recent})\nunless on ({MODEL}) "
                 f"max by ({MODEL}) ({self.sel(s.queries)})"]
        if s.target_up:
            parts.append(f"{self.sel(s.target_up)} == 0")
            parts.append(f"absent({self.sel(s.liveness)})")
        else:
            up = f"up{{{self.cfg.selector}}}" if self.cfg.selector else "up"
            parts.append(f"({up} == 0)\nand on (instance, job) "
                         f"max by (instance, job) ({recent})")
        parts.append(f"absent({self.sel(s.queries)})")
        return "\nor\n".join(parts)

    def document(self) -> dict[str, Any]:
        interval = self.w(self.cfg.evaluation_interval) if self.cfg.time_scale != 1 else (
            self.cfg.evaluation_interval)
        return {"groups": [
            {"name": "prefixwatch.rules", "interval": interval, "rules": self.recording()},
            {"name": "prefixwatch.alerts", "interval": interval, "rules": self.alerts()},
        ]}


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)


def render(source: str, cfg: RulesConfig | None = None) -> str:
    doc = Builder(source, cfg or RulesConfig()).document()
    header = (f"# Generated by `prefixwatch rules --source {source}`; do not edit by hand.\n"
              "# Recording rules are named level:metric:operations; see docs/runbooks.md.\n")
    return header + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000)
