"""Alerting rules: the hit rate collapsed, drifted low, regressed, one replica lags, the pool
evicts, the metrics are missing; and the Watchdog. Every number comes from the MixinConfig, and
with a cluster label every ``on``/``by`` keeps it, so each cluster's alerts fire on their own."""

from __future__ import annotations

from typing import Any

from prefixwatch.core.vocab import exposition, settings
from prefixwatch.core.vocab.rulenames import (
    ALERT_ABSENT,
    ALERT_DEVICE_SHARE,
    ALERT_EVICTION,
    ALERT_LOW,
    ALERT_OFFLOAD_FAILURES,
    ALERT_OUTLIER,
    ALERT_REGRESSION,
    ALERT_TIER_IDLE,
    ALERT_WATCHDOG,
    MODEL,
    MODEL_TARGET,
    R_KV,
    R_LEDGER_SHARE,
    R_PREEMPT,
    R_RESETS,
    R_WAITING,
    r_effective,
    r_lower_tier,
    r_offload_failed,
    r_queries,
    r_ratio,
    r_tier_active,
)
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.mixin.config import prom_duration
from prefixwatch.mixin.kvrules import KVRules
from prefixwatch.mixin.promql import Exprs, promql_regex_literal, promql_string
from prefixwatch.mixin.routerrules import RouterRules

#: How a description's diagnosis begins while no cause is named (a fast page can come first).
NOT_YET = "none so far"
NO_DIAGNOSIS = (f"{NOT_YET} (no prefixwatch_diagnosis is 1 for this model: the exporter's "
                "window does not show a cause yet, the cause is outside the runbook, or the "
                "exporter is not scraped).")


def render_ledger(part: str | None, share: float | None) -> str:
    """What ``Alerts.ledger_clause`` renders to: nothing without ledger series."""
    if part is None or share is None:
        return ""
    return f" Largest miss: {part} ({share * 100:.1f}% of prompt tokens)."


def render_culprit(words: str | None) -> str:
    """What ``Alerts.culprit_clause`` renders to: nothing without a culprit series."""
    return f" Culprit: {words}." if words else ""


#: The page's percentages to one decimal, as every surface shows them (core/story.py):
#: Prometheus' templates cannot multiply, so the series is queried times 100.
FIXED_PERCENT = '{{ . | first | value | printf "%.1f%%" }}'


def render_diagnosis(causes: list[str], runbook_pattern: str) -> str:
    """What ``Alerts.diagnosis_clause`` renders to, for the promtool tests' expectations."""
    named = "; ".join(f"{c} ({runbook_pattern.replace('{anchor}', c)})"
                      for c in sorted(set(causes)))
    return " Diagnosis: " + (named or NO_DIAGNOSIS)


class Alerts(Exprs):
    @property
    def effective(self) -> bool:
        """Whether the hit-rate alerts judge the effective ratio (every tier)."""
        return self.cfg.hit_ratio == settings.HIT_RATIO_EFFECTIVE and self.src.tiers is not None

    def slo(self, level: str, w: str) -> str:
        """The recorded ratio the hit-rate alerts judge: effective or device."""
        return r_effective(level, w) if self.effective else r_ratio(level, w)

    @property
    def slo_baseline(self) -> str:
        return self.cfg.baseline(self.effective)

    @property
    def ratio_name(self) -> str:
        """How the texts name the judged ratio."""
        return ("effective prefix-cache hit rate (every cache tier)" if self.effective
                else "prefix-cache hit rate (device pool)")

    def span(self, window: str) -> str:
        """A window in words for the texts ('2 minutes'), as long as it really is: under a
        time scale (the demo's), the scaled length."""
        seconds = parse_duration(window) * self.cfg.time_scale
        if seconds % 60:
            return prom_duration(seconds)
        minutes = int(seconds // 60)
        return "one minute" if minutes == 1 else f"{minutes} minutes"

    def last(self, window: str) -> str:
        """'the last minute', 'the last 5 minutes'."""
        return ("the last minute" if parse_duration(window) == 60
                else f"the last {self.span(window)}")

    def ago(self) -> str:
        """The baseline's span in words ('one to three hours ago')."""
        start = parse_duration(self.cfg.baseline_offset)
        end = start + parse_duration(self.cfg.baseline_window)
        words = dict(enumerate(("zero", "one", "two", "three", "four", "five", "six")))
        if start % 3600 == 0 and end % 3600 == 0 and end // 3600 in words:
            return f"{words[int(start // 3600)]} to {words[int(end // 3600)]} hours ago"
        return f"{prom_duration(start)} to {prom_duration(end)} ago"

    def on(self, *labels: str) -> str:
        return f"on ({self.labels(*labels)})"

    def below_threshold(self, series: str, share: float = 1.0) -> str:
        """`series < threshold` (times ``share``), with per-model thresholds and opt-outs."""
        special = dict(self.cfg.models)
        excluded = promql_regex_literal(sorted(special))
        default = f'{series}{{{MODEL}!~"{excluded}"}}' if excluded else series
        clauses = [f"{default} < {_level(self.cfg.hit_ratio_threshold, share):g}"]
        for model, override in sorted(special.items()):
            if override.disabled:
                continue
            value = (override.threshold if override.threshold is not None
                     else self.cfg.hit_ratio_threshold)
            clauses.append(f'{series}{{{MODEL}="{promql_string(model)}"}} < '
                           f'{_level(value, share):g}')
        return clauses[0] if len(clauses) == 1 else "(" + " or ".join(clauses) + ")"

    def threshold_text(self, share: float = 1.0) -> str:
        """The alerted model's threshold (times ``share``) as a percentage (a template when
        models differ)."""
        default = f"{_level(self.cfg.hit_ratio_threshold, share):.0%}"
        special = [(m, o.threshold) for m, o in sorted(self.cfg.models.items())
                   if not o.disabled and o.threshold is not None]
        if not special:
            return default
        out = ""
        for i, (model, value) in enumerate(special):
            keyword = "if" if i == 0 else "else if"
            out += (f'{{{{ {keyword} eq $labels.model_name "{promql_string(model)}" }}}}'
                    f'{_level(value, share):.0%}')
        return out + f"{{{{ else }}}}{default}{{{{ end }}}}"

    def enabled(self, series: str) -> str:
        off = [m for m, o in self.cfg.models.items() if o.disabled]
        if not off:
            return series
        return f'{series}{{{MODEL}!~"{promql_regex_literal(sorted(off))}"}}'

    def critical_expr(self) -> str:
        """PrefixCacheHitRateLow (critical): the short window below the threshold, and either
        below ``critical_collapse_share`` of it (a collapse: the few samples of the short
        window are unmistakable) or with the long window below the threshold too (a shallower
        fall, which a short dip must not fake). The value is the short window's ratio."""
        short, long_ = self.cfg.critical_windows
        return (f"{self.below_threshold(self.slo(MODEL, short))}\n"
                f"and {self.on(MODEL)} (\n"
                f"{self.below_threshold(self.slo(MODEL, short), self.cfg.critical_collapse_share)}"
                f"\nor {self.on(MODEL)}\n"
                f"{self.below_threshold(self.slo(MODEL, long_))}\n)\n"
                f"{self.guards(short)}")

    def guards(self, window: str) -> str:
        """Enough traffic, and not a cold cache after a restart."""
        return (f"and {self.on(MODEL)} {r_queries(MODEL, window)} > "
                f"{self.cfg.min_query_tokens_per_second:g}\n"
                f"unless {self.on(MODEL)} {R_RESETS} > 0")

    def diagnosis_clause(self) -> str:
        """Template text naming the causes the exporter diagnoses for the alert's model, each
        with its runbook section (a query at notification time: the alert's labels stay
        stable while the causes change)."""
        diag = exposition.OUT_DIAGNOSIS.name
        cluster = self.cfg.cluster_label
        matchers = (f"{cluster}=%q," if cluster else "") + "model_name=%q"
        args = (f"$labels.{cluster} " if cluster else "") + "$labels.model_name"
        query = f'printf "count by (cause) ({diag}{{{matchers}}} == 1)" {args}'
        link = self.cfg.runbook_url_pattern.replace("{anchor}", "{{ $s.Labels.cause }}")
        return (" Diagnosis: {{ range $i, $s := query (" + query + ") | sortByLabel \"cause\" }}"
                "{{ if $i }}; {{ end }}{{ $s.Labels.cause }} (" + link +
                "){{ else }}" + NO_DIAGNOSIS + "{{ end }}")

    def ledger_clause(self) -> str:
        """Template text naming the ledger's largest missed part and its share of the model's
        prompt tokens (R_LEDGER_SHARE, a query at notification time like the diagnosis: the
        labels stay stable); nothing where no ledger is recorded (no request log, or a source
        other than the exporter)."""
        if self.src.name != "exporter":
            return ""
        model, of_model = self.model_matchers()
        matchers, args = model + ",part!=%q", of_model + ' "achieved"'
        query = f'printf "100 * topk(1, {R_LEDGER_SHARE}{{{matchers}}})" {args}'
        return ("{{ range query (" + query + ") }} Largest miss: {{ .Labels.part }} "
                '({{ printf "%.1f" .Value }}% of prompt tokens).{{ end }}')

    def culprit_clause(self) -> str:
        """Template text naming what varies early in the alert model's prompts, in words
        (the exporter's culprit series carries the sentence every surface shows); nothing
        where the exporter knows none."""
        if self.src.name != "exporter":
            return ""
        matchers, args = self.model_matchers()
        query = f'printf "topk(1, {exposition.OUT_CULPRIT.name}{{{matchers}}})" {args}'
        return ("{{ range query (" + query + ") }} Culprit: {{ .Labels."
                + exposition.L_CULPRIT + " }}.{{ end }}")

    def model_matchers(self) -> tuple[str, str]:
        """A query's matchers of the alerted model (and cluster), as printf's format and its
        arguments."""
        cluster = self.cfg.cluster_label
        return ((f"{cluster}=%q," if cluster else "") + "model_name=%q",
                (f"$labels.{cluster} " if cluster else "") + "$labels.model_name")

    def percent_of(self, series: str) -> str:
        """Template text: the alerted model's ``series`` as a percentage to one decimal
        (FIXED_PERCENT)."""
        matchers, args = self.model_matchers()
        return ("{{ with query (printf \"100 * " + series + "{" + matchers + "}\" " + args
                + ") }}" + FIXED_PERCENT + "{{ end }}")

    def alert(self, name: str, expr: str, for_: str | None, severity: str, summary: str,
              description: str, anchor: str | None = None) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": name, "expr": expr}
        if for_:
            rule["for"] = self.w(for_)
        rule["labels"] = {"severity": severity}
        rule["annotations"] = {"summary": summary, "description": description,
                               "runbook_url": self.cfg.runbook(anchor or name)}
        return rule

    def hit_rate_alerts(self) -> list[dict[str, Any]]:
        """The page (critical), the drift's and the regression's tickets, the outlier."""
        cfg = self.cfg
        pct = "{{ $value | humanizePercentage }}"
        model = "{{ $labels.model_name }}"
        threshold = self.threshold_text()
        short, long_ = cfg.critical_windows
        ww, rw = cfg.warning_window, cfg.regression_window
        ratio = self.ratio_name
        short_pct = self.percent_of(self.slo(MODEL, short))
        warn_pct = self.percent_of(self.slo(MODEL, ww))
        return [
            self.alert(
                ALERT_LOW, self.critical_expr(), cfg.critical_for, "critical",
                f"Prefix-cache hit rate of {model} collapsed to {short_pct} over "
                f"{self.span(short)}.",
                f"The {ratio} of {model} is {short_pct} over {self.last(short)}, below "
                f"{threshold}: a collapse (below "
                f"{self.threshold_text(cfg.critical_collapse_share)}) or a fall that "
                f"{self.last(long_)} confirm. Prompts are recomputed from scratch: "
                "TTFT and GPU load go up. Usually something now changes near the top of the "
                "prompt (a timestamp, an id, tool order)." + self.diagnosis_clause()
                + self.culprit_clause() + self.ledger_clause(),
            ),
            self.alert(
                ALERT_LOW,
                f"{self.below_threshold(self.slo(MODEL, ww))}\n{self.guards(ww)}",
                cfg.warning_for, "warning",
                f"Prefix-cache hit rate of {model} is low ({warn_pct} over {self.span(ww)}).",
                f"The {ratio} of {model} has been below {threshold} for "
                f"{self.span(cfg.warning_for)} ({warn_pct} now, over {self.span(ww)}). A slow "
                "drift: more distinct prefixes, a fuller KV pool, or a prompt change rolled out "
                "gradually." + self.diagnosis_clause() + self.culprit_clause()
                + self.ledger_clause(),
            ),
            self.alert(
                ALERT_REGRESSION,
                f"{self.enabled(self.slo(MODEL, rw))}\n< {self.on(MODEL)}\n"
                f"{self.slo_baseline} - {cfg.regression_drop:g}\n{self.guards(rw)}",
                cfg.regression_for, "warning",
                f"Prefix-cache hit rate of {model} regressed to {pct}.",
                f"The {ratio} of {model} is {pct} over {self.span(rw)}, "
                f"{cfg.regression_drop:.0%} or more below its own level {self.ago()} "
                "(it may still be above the alert threshold). Check what was deployed."
                + self.diagnosis_clause(),
            ),
            self.alert(
                ALERT_OUTLIER,
                f"{self.enabled(self.slo(MODEL_TARGET, ww))}\n< {self.on(MODEL)} group_left ()"
                f"\n({self.slo(MODEL, ww)} - {cfg.outlier_gap:g})\n"
                f"and {self.on(MODEL, 'target')} {r_queries(MODEL_TARGET, ww)} > "
                f"{cfg.min_query_tokens_per_second:g}\n"
                f"and {self.on(MODEL)} count by ({self.labels(MODEL)}) "
                f"({r_queries(MODEL_TARGET, ww)}) > 1",
                cfg.warning_for, "warning",
                f"Replica {{{{ $labels.target }}}} of {model} has a low hit rate ({pct}).",
                f"Replica {{{{ $labels.target }}}} serves {model} with an {ratio} "
                f"of {pct}, more than {cfg.outlier_gap:.0%} below the model's fleet. Routing "
                "sends it prefixes the others hold (round-robin), or its pool is evicting."
                + self.diagnosis_clause(),
            ),
        ]

    def alerts(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        pct = "{{ $value | humanizePercentage }}"
        model = "{{ $labels.model_name }}"
        out = self.hit_rate_alerts()
        evict_extra = (f"and {self.on(MODEL, 'target')} {R_PREEMPT} > 0" if self.src.preemptions
                       else f"and {self.on(MODEL, 'target')} {R_WAITING} > 0")
        if self.src.kv_usage:
            out.append(self.alert(
                ALERT_EVICTION,
                f"{R_KV} > {cfg.kv_usage_high:g}\n{evict_extra}",
                cfg.eviction_for, "warning",
                f"KV-cache pool of {{{{ $labels.target }}}} ({model}) is full and evicting.",
                f"KV-cache usage on {{{{ $labels.target }}}} ({model}) is {pct} with requests "
                "preempted or queued: cached prefixes are evicted before they can be reused.",
            ))
        out += self.tier_alerts()
        out += KVRules(self.src.name, self.cfg).alerts(self)
        out += RouterRules(self.src.name, self.cfg).alerts(self)
        out.append(self.alert(ALERT_ABSENT, self.absent_expr(), "5m", "warning",
                              "Prefix-cache metrics are missing"
                              "{{ if $labels.target }} for {{ $labels.target }}{{ end }}.",
                              "No prefix-cache series (or the target is down), so the hit-rate "
                              "alerts cannot fire. Check the exporter and the vLLM /metrics "
                              "endpoint."))
        out.append(self.alert(ALERT_WATCHDOG, "vector(1)", None, "none",
                              "Always firing: proves the alerting pipeline works.",
                              "A dead man's switch. If its notifications stop, Prometheus or "
                              "Alertmanager is broken."))
        return out

    def tier_alerts(self) -> list[dict[str, Any]]:
        """A second tier that saves nothing, HBM outgrown, offload stores lost."""
        cfg, t = self.cfg, self.src.tiers
        if t is None:
            return []
        pct = "{{ $value | humanizePercentage }}"
        model = "{{ $labels.model_name }}"
        idle_share = cfg.diagnosis.thresholds.tier_idle_hit_share
        ww = cfg.warning_window
        out = [self.alert(
            ALERT_TIER_IDLE,
            f"{self.enabled(r_lower_tier(MODEL, ww))} < {idle_share:g}\n"
            f"and {self.on(MODEL)} {self.below_threshold(r_ratio(MODEL, ww))}\n"
            f"and {self.on(MODEL)} {r_tier_active(ww)}\n{self.guards(ww)}",
            cfg.tier_for, "warning",
            f"The second cache tier of {model} serves almost nothing ({pct} of device misses).",
            f"A second cache tier (CPU offload, HiCache, a KV connector) of {model} takes data "
            f"but served only {pct} of the prompt tokens the device pool missed over "
            f"{self.span(ww)}, while the device pool's own hit rate is below "
            f"{self.threshold_text()}. It costs host memory and copy bandwidth and saves no "
            "prefill: the tier is too small for the working set, or what it stores is never "
            "asked for again.")]
        out.append(self.alert(
            ALERT_DEVICE_SHARE,
            f"{self.enabled(r_ratio(MODEL, ww))}\n< {self.on(MODEL)}\n"
            f"{cfg.baseline()} - {cfg.regression_drop:g}\n"
            f"and {self.on(MODEL)} {r_effective(MODEL, ww)}\n"
            f">= {self.on(MODEL)} {cfg.baseline(effective=True)} - {cfg.regression_drop:g}\n"
            f"{self.guards(ww)}",
            cfg.tier_for, "warning",
            f"The device pool of {model} serves less ({pct}); a slower tier makes up for it.",
            f"The device (HBM) hit rate of {model} is {pct} over {self.span(ww)}, "
            f"{cfg.regression_drop:.0%} or more below its level {self.ago()}, while "
            "the effective hit rate (every tier) held: the working set outgrew the device pool "
            "and a slower tier serves the rest. No prefill is wasted, but TTFT pays each load "
            "from host, disk or remote."))
        if t.offload_outcomes:
            out.append(self.alert(
                ALERT_OFFLOAD_FAILURES,
                f"{r_offload_failed(ww)} > {cfg.offload_failure_share:g}",
                cfg.warning_for, "warning",
                f"KV offload of {{{{ $labels.target }}}} ({model}) loses {pct} of its stores.",
                f"The KV offload connector of {{{{ $labels.target }}}} ({model}) dropped {pct} "
                f"of the blocks it tried to store over {self.span(ww)} (host pool full, request "
                "gone, block not hashed): those prefixes cannot be served from the host tier "
                "later."))
        return out

    def absent_expr(self) -> str:
        """A model whose series vanished, a target that is down, or no data at all (and, with
        a cluster label, a cluster whose exporter vanished)."""
        s = self.src
        by_model = self.labels(MODEL)
        recent = f"last_over_time({self.sel(s.queries)}[{self.w('1h')}])"
        parts = [f"max by ({by_model}) ({recent})\nunless {self.on(MODEL)} "
                 f"max by ({by_model}) ({self.sel(s.queries)})"]
        if s.target_up:
            parts.append(f"{self.sel(s.target_up)} == 0")
            if self.cfg.cluster_label:
                live = self.sel(s.liveness)
                parts.append(f"max by ({self.labels()}) (last_over_time({live}[{self.w('1h')}]))"
                             f"\nunless {self.on()} max by ({self.labels()}) ({live})")
            parts.append(f"absent({self.sel(s.liveness)})")
        else:
            up = f"up{{{self.cfg.selector}}}" if self.cfg.selector else "up"
            parts.append(f"({up} == 0)\nand {self.on('instance', 'job')} "
                         f"max by ({self.labels('instance', 'job')}) ({recent})")
        parts.append(f"absent({self.sel(s.queries)})")
        return "\nor\n".join(parts)


def _level(threshold: float, share: float) -> float:
    """A share of a threshold, without float noise in the rule text (0.7 * 0.5 is 0.35)."""
    return round(threshold * share, 6)
