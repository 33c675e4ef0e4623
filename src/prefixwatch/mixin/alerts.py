"""Alerting rules: the hit rate collapsed, drifted low, regressed, one replica lags, the pool
evicts, the metrics are missing; and the Watchdog. Every number comes from the MixinConfig, and
with a cluster label every ``on``/``by`` keeps it, so each cluster's alerts fire on their own."""

from __future__ import annotations

from typing import Any

from prefixwatch.core import names
from prefixwatch.core.rulenames import (
    ALERT_ABSENT,
    ALERT_EVICTION,
    ALERT_LOW,
    ALERT_OUTLIER,
    ALERT_REGRESSION,
    ALERT_WATCHDOG,
    MODEL,
    MODEL_TARGET,
    R_BASELINE,
    R_KV,
    R_PREEMPT,
    R_RESETS,
    R_WAITING,
    r_queries,
    r_ratio,
)
from prefixwatch.mixin.promql import Exprs, promql_regex_literal, promql_string

NO_DIAGNOSIS = ("none (no prefixwatch_diagnosis is 1 for this model: a cause outside the "
                "runbook, or the exporter is not scraped).")


def render_diagnosis(causes: list[str], runbook_pattern: str) -> str:
    """What ``Alerts.diagnosis_clause`` renders to, for the promtool tests' expectations."""
    named = "; ".join(f"{c} ({runbook_pattern.replace('{anchor}', c)})"
                      for c in sorted(set(causes)))
    return " Diagnosis: " + (named or NO_DIAGNOSIS)


class Alerts(Exprs):
    def on(self, *labels: str) -> str:
        return f"on ({self.labels(*labels)})"

    def below_threshold(self, series: str) -> str:
        """`series < threshold`, with per-model thresholds and opt-outs."""
        special = dict(self.cfg.models)
        clauses = []
        excluded = promql_regex_literal(sorted(special))
        default = f'{series}{{{MODEL}!~"{excluded}"}}' if excluded else series
        clauses.append(f"{default} < {self.cfg.hit_ratio_threshold:g}")
        for model, override in sorted(special.items()):
            if override.disabled:
                continue
            value = (override.threshold if override.threshold is not None
                     else self.cfg.hit_ratio_threshold)
            clauses.append(f'{series}{{{MODEL}="{promql_string(model)}"}} < {value:g}')
        return clauses[0] if len(clauses) == 1 else "(" + " or ".join(clauses) + ")"

    def threshold_text(self) -> str:
        """The alerted model's threshold as a percentage (a template when models differ)."""
        default = f"{self.cfg.hit_ratio_threshold:.0%}"
        special = [(m, o.threshold) for m, o in sorted(self.cfg.models.items())
                   if not o.disabled and o.threshold is not None]
        if not special:
            return default
        out = ""
        for i, (model, value) in enumerate(special):
            keyword = "if" if i == 0 else "else if"
            out += f'{{{{ {keyword} eq $labels.model_name "{promql_string(model)}" }}}}{value:.0%}'
        return out + f"{{{{ else }}}}{default}{{{{ end }}}}"

    def enabled(self, series: str) -> str:
        off = [m for m, o in self.cfg.models.items() if o.disabled]
        if not off:
            return series
        return f'{series}{{{MODEL}!~"{promql_regex_literal(sorted(off))}"}}'

    def guards(self, window: str) -> str:
        """Enough traffic, and not a cold cache after a restart."""
        return (f"and {self.on(MODEL)} {r_queries(MODEL, window)} > "
                f"{self.cfg.min_query_tokens_per_second:g}\n"
                f"unless {self.on(MODEL)} {R_RESETS} > 0")

    def diagnosis_clause(self) -> str:
        """Template text naming the causes the exporter diagnoses for the alert's model, each
        with its runbook section (a query at notification time: the alert's labels stay
        stable while the causes change)."""
        diag = names.OUT_DIAGNOSIS.name
        cluster = self.cfg.cluster_label
        matchers = (f"{cluster}=%q," if cluster else "") + "model_name=%q"
        args = (f"$labels.{cluster} " if cluster else "") + "$labels.model_name"
        query = f'printf "count by (cause) ({diag}{{{matchers}}} == 1)" {args}'
        link = self.cfg.runbook_url_pattern.replace("{anchor}", "{{ $s.Labels.cause }}")
        return (" Diagnosis: {{ range $i, $s := query (" + query + ") | sortByLabel \"cause\" }}"
                "{{ if $i }}; {{ end }}{{ $s.Labels.cause }} (" + link +
                "){{ else }}" + NO_DIAGNOSIS + "{{ end }}")

    def alert(self, name: str, expr: str, for_: str | None, severity: str, summary: str,
              description: str, anchor: str | None = None) -> dict[str, Any]:
        rule: dict[str, Any] = {"alert": name, "expr": expr}
        if for_:
            rule["for"] = self.w(for_)
        rule["labels"] = {"severity": severity}
        rule["annotations"] = {"summary": summary, "description": description,
                               "runbook_url": self.cfg.runbook(anchor or name)}
        return rule

    def alerts(self) -> list[dict[str, Any]]:
        cfg = self.cfg
        pct = "{{ $value | humanizePercentage }}"
        model = "{{ $labels.model_name }}"
        threshold = self.threshold_text()
        out = [
            self.alert(
                ALERT_LOW,
                f"{self.below_threshold(r_ratio(MODEL, '1m'))}\n"
                f"and {self.on(MODEL)} {self.below_threshold(r_ratio(MODEL, '5m'))}\n"
                f"{self.guards('5m')}",
                "2m", "critical",
                f"Prefix-cache hit rate of {model} collapsed to {pct}.",
                f"The prefix-cache hit rate of {model} is {pct} over the last minute and below "
                f"{threshold} over five minutes. Prompts are recomputed from scratch: "
                "TTFT and GPU load go up. Usually something now changes near the top of the "
                "prompt (a timestamp, an id, tool order)." + self.diagnosis_clause(),
            ),
            self.alert(
                ALERT_LOW,
                f"{self.below_threshold(r_ratio(MODEL, '15m'))}\n{self.guards('15m')}",
                "15m", "warning",
                f"Prefix-cache hit rate of {model} is low ({pct}).",
                f"The prefix-cache hit rate of {model} has been below {threshold} for "
                f"15 minutes ({pct} now, over 15 minutes). A slow drift: more distinct prefixes, "
                "a fuller KV pool, or a prompt change rolled out gradually."
                + self.diagnosis_clause(),
            ),
            self.alert(
                ALERT_REGRESSION,
                f"{self.enabled(r_ratio(MODEL, '15m'))}\n< {self.on(MODEL)}\n"
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
                f"{self.enabled(r_ratio(MODEL_TARGET, '15m'))}\n< {self.on(MODEL)} group_left ()"
                f"\n({r_ratio(MODEL, '15m')} - {cfg.outlier_gap:g})\n"
                f"and {self.on(MODEL, 'target')} {r_queries(MODEL_TARGET, '15m')} > "
                f"{cfg.min_query_tokens_per_second:g}\n"
                f"and {self.on(MODEL)} count by ({self.labels(MODEL)}) "
                f"({r_queries(MODEL_TARGET, '15m')}) > 1",
                "15m", "warning",
                f"Replica {{{{ $labels.target }}}} of {model} has a low hit rate ({pct}).",
                f"Replica {{{{ $labels.target }}}} serves {model} with a prefix-cache hit rate "
                f"of {pct}, more than {cfg.outlier_gap:.0%} below the model's fleet. Routing "
                "sends it prefixes the others hold (round-robin), or its pool is evicting."
                + self.diagnosis_clause(),
            ),
        ]
        evict_extra = (f"and {self.on(MODEL, 'target')} {R_PREEMPT} > 0" if self.src.preemptions
                       else f"and {self.on(MODEL, 'target')} {R_WAITING} > 0")
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
                        "runbook_url": cfg.runbook(ALERT_WATCHDOG)}})
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
