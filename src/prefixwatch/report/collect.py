"""Everything the report shows, fetched from Prometheus in one pass.

The report reads the series the alerts read: the mixin's recorded ratios and rates (their names
come from core/vocab/rulenames.py). Figure 1 draws the ratio that pages (effective or device, as the
rules judge it, over the critical alert's short window) against the threshold that pages, and
the timeline, the phases and the cost follow the same series, so the report can never show a
breach that did not page. Without the prefixwatch rules loaded there is nothing to read: the
error says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from prefixwatch.core.story import window_words
from prefixwatch.core.vocab import exposition, settings
from prefixwatch.core.vocab.rulenames import (
    ALERT_PATTERN,
    MODEL,
    MODEL_TARGET,
    MODEL_TIER,
    R_LEDGER_SHARE,
    R_TTFT,
    REPLICA_WINDOW,
    r_cached,
    r_effective,
    r_ratio,
    r_recomputed,
)
from prefixwatch.core.vocab.tiers import TIERS
from prefixwatch.core.vocab.windows import parse_duration, ratio
from prefixwatch.report.model import (
    TTFT_QUANTILES,
    PhaseStats,
    Recorded,
    ReportData,
    Request,
    recorded,
)
from prefixwatch.report.promapi import PromClient, RecordingRule, ReportError, Series
from prefixwatch.report.timeline import (
    AlertFiring,
    Interval,
    Phase,
    crossings,
    merge,
    phases,
    runs,
    typical_spacing,
)

DIAGNOSIS = exposition.OUT_DIAGNOSIS.name
L_PART = exposition.L_PART
L_TIER = exposition.L_TIER
MAX_POINTS_PER_SERIES = 720


def _sel(model: str, extra: str = "") -> str:
    escaped = model.replace("\\", "\\\\").replace('"', '\\"')
    return "{" + f'{exposition.L_MODEL}="{escaped}"' + (f",{extra}" if extra else "") + "}"


#: A range selector in a rule's expression ('[6s]', '[2m]').
_RANGE = re.compile(r"\[(\d+(?:ms|s|m|h|d))\]")

def _quantile(q: float) -> str:
    return f'quantile="{q:g}"'


def _dur(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


class Collector:
    """Runs the report's queries against one Prometheus."""

    def __init__(self, client: PromClient, req: Request) -> None:
        if req.end <= req.start:
            raise ReportError("the report's range is empty: --from must be before --to")
        if not 0 < req.threshold < 1:
            raise ReportError(f"the threshold must be between 0 and 1, not {req.threshold}")
        self.client = client
        self.notes: list[str] = []
        loaded = self._loaded_rule(req)
        req = self.req = self._with_loaded_scale(req, loaded)
        self.names = recorded(req.hit_ratio, req.ratio_window)
        self.device = recorded(settings.HIT_RATIO_DEVICE, req.ratio_window)
        self.effective = recorded(settings.HIT_RATIO_EFFECTIVE, req.ratio_window)
        self.window = parse_duration(req.ratio_window) * req.time_scale
        self.replica_window = parse_duration(REPLICA_WINDOW) * req.time_scale
        #: How far the recorded ratio lags the traffic it describes: one scrape and one
        #: evaluation (the scrape taken as long as the evaluation, as the stack configures).
        #: The phases leave this out, and one step of the range, which rounds each crossing
        #: up to a step later.
        self.delay = 2 * loaded.interval if loaded is not None and loaded.interval else 0.0
        self._set_range(req.start, req.end)

    def _loaded_rule(self, req: Request) -> RecordingRule | None:
        """The rule Prometheus has loaded for the ratio that pages (None when it says none)."""
        try:
            rules = self.client.recording_rules()
        except ReportError:
            return None
        return rules.get(recorded(req.hit_ratio, req.ratio_window).num)

    def _with_loaded_scale(self, req: Request, loaded: RecordingRule | None) -> Request:
        """The request on the time scale of the rules Prometheus has loaded (the demo's
        compress every window): the recorded series' own range says it, so a report without
        --config reads the windows that really paged."""
        ranges = {parse_duration(r) for r in _RANGE.findall(loaded.query if loaded else "")}
        if len(ranges) != 1:
            return req
        scale = ranges.pop() / parse_duration(req.ratio_window)
        if math.isclose(scale, req.time_scale, rel_tol=0.01):
            return req
        self.notes.append(f"Prometheus' rules compute the {req.ratio_window} series over "
                          f"{window_words(scale * parse_duration(req.ratio_window))} (time "
                          f"scale {scale:g}): this report reads them so.")
        return replace(req, time_scale=scale)

    def _set_range(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.span = end - start
        self.step = max(1.0, math.ceil(self.span / MAX_POINTS_PER_SERIES))

    def models(self) -> dict[str, float]:
        """Models with recorded series in the range, with their traffic (the denominator)."""
        found = self.client.query(
            f"sum by ({exposition.L_MODEL}) (sum_over_time({self.names.den}[{_dur(self.span)}]))",
            self.end)
        return {s.labels.get(exposition.L_MODEL, ""): s.samples[0][1] for s in found}

    def pick_model(self) -> tuple[str, list[str]]:
        models = self.models()
        if not models:
            raise ReportError(
                f"no prefixwatch series ({self.names.den}) in Prometheus at {self.client.base} "
                f"between {_iso(self.start)} and {_iso(self.end)}: is the exporter scraped, "
                "are the prefixwatch rules loaded (alerts/prefixwatch.*.rules.yml), and is the "
                "range right?")
        known = sorted(models)
        if self.req.model is not None:
            if self.req.model not in models:
                raise ReportError(f"model {self.req.model!r} is unknown in that range; "
                                  f"known: {', '.join(known)}")
            return self.req.model, known
        return max(models, key=lambda m: (models[m], m)), known

    def clip(self, model: str) -> str:
        """Narrow the range to where the model's series have samples; a note when it did."""
        found = self._range(f"{self.names.den}{_sel(model)}")
        times = [t for s in found for t, _ in s.samples]
        if not times:
            return ""
        first, last = max(self.start, min(times) - self.step), min(self.end, max(times))
        if first <= self.start + 2 * self.step and last >= self.end - 2 * self.step:
            return ""
        asked = (self.start, self.end)
        self._set_range(first, max(last, first + self.step))
        return (f"The range asked ({_iso(asked[0])} to {_iso(asked[1])}) is longer than the "
                f"data: the report covers {_iso(self.start)} to {_iso(self.end)}, where "
                f"{self.names.den} has samples.")

    def _range(self, expr: str) -> list[Series]:
        return self.client.query_range(expr, self.start, self.end, self.step)

    @staticmethod
    def _finite(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(t, v) for t, v in samples if math.isfinite(v)]

    def _one(self, expr: str) -> list[tuple[float, float]]:
        found = self._range(expr)
        return self._finite(found[0].samples) if found else []

    def ttft_series(self, model: str) -> dict[float, list[tuple[float, float]]]:
        found = {q: self._one(f"{R_TTFT}{_sel(model, _quantile(q))}") for q in TTFT_QUANTILES}
        return {q: samples for q, samples in found.items() if samples}

    def alert_firings(self, model: str) -> list[AlertFiring]:
        span = _dur(self.span)
        sel = f'alertname=~"{ALERT_PATTERN}"'
        firing = self.client.query(f'ALERTS{{{sel},alertstate="firing"}}[{span}]', self.end)
        for_state = self.client.query(f"ALERTS_FOR_STATE{{{sel}}}[{span}]", self.end)
        firing = [s for s in firing if s.labels.get(exposition.L_MODEL, model) == model]
        spacing = typical_spacing(s.samples for s in firing + for_state) or self.step
        active = {_alert_key(s.labels): s.samples for s in for_state}
        out = []
        for s in firing:
            for iv in runs(s.samples, spacing, self.end):
                since = None
                for t, v in active.get(_alert_key(s.labels), []):
                    if t <= iv.start + spacing / 2:
                        since = v
                out.append(AlertFiring(s.labels.get("alertname", "?"),
                                       s.labels.get("severity", ""), s.labels, iv, since))
        return sorted(out, key=lambda a: (a.interval.start, a.name))

    def diagnosis(self, model: str) -> dict[str, list[tuple[str, Interval]]]:
        found = self.client.query(f"{DIAGNOSIS}{_sel(model)}[{_dur(self.span)}]", self.end)
        spacing = typical_spacing(s.samples for s in found) or self.step
        out: dict[str, list[tuple[str, Interval]]] = {}
        for s in found:
            cause = s.labels.get(exposition.L_CAUSE, "?")
            for iv in runs(s.samples, spacing, self.end, holds=lambda v: v >= 1):
                out.setdefault(cause, []).append((s.labels.get(exposition.L_TARGET, ""), iv))
        return {c: sorted(v, key=lambda x: x[1].start) for c, v in sorted(out.items())}

    def tiers(self, model: str) -> dict[str, list[tuple[float, float]]] | None:
        w = self.req.ratio_window
        by_tier = self._range(f"{r_cached(MODEL_TIER, w)}{_sel(model)}")
        if not by_tier:
            return None
        out = {s.labels.get(L_TIER, "unknown"): self._finite(s.samples) for s in by_tier}
        out = {t: out[t] for t in (*TIERS, *sorted(set(out) - set(TIERS))) if t in out}
        recomputed = self._one(f"{r_recomputed(MODEL, w)}{_sel(model)}")
        if recomputed:
            out["recomputed"] = recomputed
        return out

    def ledger(self, model: str) -> dict[str, list[tuple[float, float]]] | None:
        """Shares of prompt tokens by ledger part (achieved, the parts, unexplained)."""
        parts = self._range(f"{R_LEDGER_SHARE}{_sel(model)}")
        if not parts:
            return None
        return {s.labels.get(L_PART, ""): self._finite(s.samples) for s in parts}

    def _pool_curve(self, data: ReportData) -> None:
        """The pool what-if curve over the drop (the "during" phase), else the whole range."""
        from prefixwatch.report.poolfigure import pool_curve

        during = data.phase("during")
        start, end = ((during.phase.start, during.phase.end) if during is not None
                      else (self.start, self.end))
        data.pool_curve = pool_curve(self.client, _sel(data.model), start, end, self.step)
        data.pool_curve_span = "during the drop" if during is not None else "over the range"

    def ladder(self, model: str) -> tuple[str, list[str]] | None:
        """The model's ladder (prefixwatch_ladder_hit_ratio) at the end of the range, over
        the longest window the exporter wrote it for."""
        from prefixwatch.core.kv.ladder import lines

        found: dict[str, dict[str, float]] = {}
        for s in self._range(f"{exposition.OUT_LADDER.name}{_sel(model)}"):
            samples = self._finite(s.samples)
            if samples:
                found.setdefault(s.labels.get(exposition.L_WINDOW, ""), {})[
                    s.labels.get(exposition.L_RUNG, "")] = samples[-1][1]
        if not found:
            return None
        window = max(found, key=lambda w: _window_seconds(w))
        return window, lines(found[window])

    def _inside(self, metric: str, span: Phase, window: float | None = None) -> str:
        """The mean over ``span`` of a recorded rate, from samples (one a step) whose windows
        (``window`` seconds, the paging ratio's by default) lie inside the span: each covers
        the window before it, so traffic from the other side of a transition never counts
        (the span's edges weigh less). A span one window long is its last sample."""
        inner = span.seconds - (self.window if window is None else window)
        if inner < 1:
            return metric
        return f"avg_over_time({metric}[{_dur(inner)}:{_dur(min(self.step, inner))}])"

    def _mean(self, metric: str, model: str, span: Phase, by: str = "",
              window: float | None = None) -> dict[str, float]:
        """The mean of a recorded rate over a span (see _inside), per ``by`` (one value
        without)."""
        group = f" by ({by})" if by else ""
        found = self.client.query(
            f"sum{group} ({self._inside(metric + _sel(model), span, window)})", span.end)
        return {s.labels.get(by, ""): s.samples[0][1] for s in found}

    def _phase_ratio(self, series: Recorded, model: str, span: Phase) -> float | None:
        num = self._mean(series.num, model, span).get("", math.nan)
        return ratio(num, self._mean(series.den, model, span).get("", math.nan))

    def phase_stats(self, model: str, phase: Phase) -> PhaseStats:
        """Each ratio over a phase: the mean of its recorded numerator over the mean of its
        denominator (summed before dividing, as the rules do)."""
        queries = self._mean(self.device.den, model, phase).get("", math.nan) * phase.seconds
        hits = self._mean(self.device.num, model, phase).get("", math.nan) * phase.seconds
        num = self._mean(self.names.replica_num, model, phase, exposition.L_TARGET,
                         self.replica_window)
        den = self._mean(self.names.replica_den, model, phase, exposition.L_TARGET,
                         self.replica_window)
        ttft = {}
        for q in TTFT_QUANTILES:
            found = self.client.query(
                f"avg({self._inside(R_TTFT + _sel(model, _quantile(q)), phase)})", phase.end)
            value = found[0].samples[0][1] if found else math.nan
            ttft[q] = value if math.isfinite(value) else None
        return PhaseStats(phase, ratio(hits, queries),
                          self._phase_ratio(self.effective, model, phase),
                          {t: ratio(num.get(t, math.nan), den[t]) for t in sorted(den)}, ttft,
                          0.0 if math.isnan(queries) else queries,
                          0.0 if math.isnan(hits) else hits,
                          self._phase_ratio(self.names, model, phase))

    def collect(self) -> ReportData:
        req = self.req
        model, known = self.pick_model()
        notes = [*self.notes, *([note] if (note := self.clip(model)) else [])]
        if req.model is None and len(known) > 1:
            notes.append(f"Several models in range ({', '.join(known)}); this report is on "
                         f"the busiest, {model} (choose with --model).")
        fleet = self._one(f"{self.names.ratio}{_sel(model)}")
        device = (self._one(f"{self.device.ratio}{_sel(model)}")
                  if req.hit_ratio != settings.HIT_RATIO_DEVICE else [])
        replica = r_effective if req.hit_ratio == settings.HIT_RATIO_EFFECTIVE else r_ratio
        replicas = {s.labels.get(exposition.L_TARGET, "?"): self._finite(s.samples)
                    for s in self._range(f"{replica(MODEL_TARGET, REPLICA_WINDOW)}{_sel(model)}")}
        cross = crossings(fleet, req.threshold)
        stats = [self.phase_stats(model, p)
                 for p in phases(self.start, self.end, cross, self.window, self.delay + self.step)
                 if p.seconds >= self.window]
        data = ReportData(
            prometheus=self.client.base, model=model, models=known, start=self.start,
            end=self.end, step=self.step, window=self.window, threshold=req.threshold,
            fleet=fleet, device=device, replicas=dict(sorted(replicas.items())),
            ttft=self.ttft_series(model), alerts=self.alert_firings(model),
            diagnosis=self.diagnosis(model), crossings=cross, phases=stats,
            tiers=self.tiers(model), ledger=self.ledger(model), hit_ratio=req.hit_ratio,
            ratio_window=req.ratio_window, notes=notes, ladder=self.ladder(model),
            replica_window=self.replica_window)
        data.culprit = self.culprit(model, cross.first_drop)
        self._pool_curve(data)
        if not stats:
            data.phase_note = (f"No phase of the range is longer than the {self.window:.0f}s "
                               "rate window: widen the range.")
        self._incident_cost(data)
        return data

    def culprit(self, model: str, since: float | None) -> str | None:
        """The exporter's culprit in words most often recorded from the drop on (over the
        range without a drop); None when it recorded none."""
        found = self.client.query(f"{exposition.OUT_CULPRIT.name}{_sel(model)}[{_dur(self.span)}]",
                                  self.end)
        seen = {}
        for s in found:
            words = s.labels.get(exposition.L_CULPRIT)
            n = sum(1 for t, _ in s.samples if since is None or t >= since)
            if words and n:
                seen[words] = seen.get(words, 0) + n
        return max(seen, key=lambda w: (seen[w], w)) if seen else None

    def _incident_cost(self, data: ReportData) -> None:
        """Prompt tokens recomputed because of the incident: the incident's prompt tokens at
        the healthy ratio, minus what was served; in GPU-seconds and money when rates are
        given. ``cost_note`` says in one line why there is no figure."""
        cross, before = data.crossings, data.phase("before")
        firing = merge(a.interval for a in data.alerts)
        if cross.first_drop is None:
            data.cost_note = (f"The {data.ratio_label} stayed above the threshold in this "
                              "range: no incident, nothing to attribute.")
            return
        start = max(data.start, cross.first_drop - data.window)
        end = cross.recovery if cross.recovery is not None else data.end
        if firing:
            end = max(end, min(firing[-1].end, data.end))
        data.incident = Interval(start, end, open=cross.recovery is None)
        if before is None or before.judged is None:
            data.cost_note = (f"The range holds no healthy baseline (the {data.ratio_label} is "
                              "below the threshold from its start): widen --since or --from "
                              "to before the incident.")
            return
        if end - start < self.step:
            data.cost_note = "The incident is shorter than one step of the range."
            return
        span = Phase("incident", start, end)
        prompt = self._mean(self.names.den, data.model, span).get("", 0.0) * span.seconds
        served = self._mean(self.names.num, data.model, span).get("", 0.0) * span.seconds
        data.extra_recomputed_tokens = max(0.0, prompt * before.judged - served)
        if self.req.prefill_tokens_per_second:
            data.gpu_seconds = data.extra_recomputed_tokens / self.req.prefill_tokens_per_second
        if self.req.price_per_million_tokens is not None:
            data.cost = data.extra_recomputed_tokens * self.req.price_per_million_tokens / 1e6


def _window_seconds(window: str) -> float:
    try:
        return parse_duration(window)
    except ValueError:
        return 0.0


def _alert_key(labels: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items()
                        if k not in ("__name__", "alertstate")))


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
