"""Everything the report shows, fetched from Prometheus in one pass.

PromQL is built from the raw series names of core/names.py (sum of rates of hits over sum of
rates of queries, never an average of ratios), so it works whether or not the recording rules
are loaded, at any rule time scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prefixwatch.core import names
from prefixwatch.core.rulenames import ALERT_PATTERN
from prefixwatch.core.tiers import TIERS
from prefixwatch.core.windows import ratio
from prefixwatch.report.promapi import PromClient, ReportError, Series
from prefixwatch.report.timeline import (
    AlertFiring,
    Crossings,
    Interval,
    Phase,
    crossings,
    merge,
    phases,
    runs,
    typical_spacing,
)

QUERIES = names.OUT_QUERIES.name + "_total"
HITS = names.OUT_HITS.name + "_total"
PROMPT = names.OUT_PROMPT_TOKENS.name + "_total"
CACHED = names.OUT_PROMPT_TOKENS_CACHED.name + "_total"
TTFT_BUCKET = names.OUT_TTFT.name + "_bucket"
DIAGNOSIS = names.OUT_DIAGNOSIS.name
LEDGER = names.OUT_LEDGER_TOKENS.name + "_total"
L_PART = names.L_PART
L_TIER = names.L_TIER
LEDGER_PARTS = ("novel", "layout", "routing", "eviction")
TTFT_QUANTILES = (0.5, 0.95)
MAX_POINTS_PER_SERIES = 720


@dataclass(frozen=True)
class Request:
    """What to report on."""

    start: float
    end: float
    threshold: float
    model: str | None = None
    #: Rate window in seconds; None: four scrape intervals (at least two steps).
    window: float | None = None
    prefill_tokens_per_second: float | None = None
    price_per_million_tokens: float | None = None


@dataclass
class PhaseStats:
    phase: Phase
    hit_ratio: float | None
    effective_ratio: float | None
    per_replica: dict[str, float | None]
    ttft: dict[float, float | None]
    queries: float
    hits: float


@dataclass
class ReportData:
    """The fetched and derived figures, ready to draw and write."""

    prometheus: str
    model: str
    models: list[str]
    start: float
    end: float
    step: float
    window: float
    threshold: float
    fleet: list[tuple[float, float]]
    replicas: dict[str, list[tuple[float, float]]]
    ttft: dict[float, list[tuple[float, float]]]
    alerts: list[AlertFiring]
    diagnosis: dict[str, list[tuple[str, Interval]]]
    crossings: Crossings
    phases: list[PhaseStats]
    #: tier -> tokens/s served from it, and "recomputed"; None when no tier series exist.
    tiers: dict[str, list[tuple[float, float]]] | None
    #: ledger part -> share of prompt tokens over time; None when the ledger is not exported.
    ledger: dict[str, list[tuple[float, float]]] | None
    incident: Interval | None = None
    extra_recomputed_tokens: float | None = None
    gpu_seconds: float | None = None
    cost: float | None = None
    notes: list[str] = field(default_factory=list)
    divergence: dict | None = None

    def phase(self, name: str) -> PhaseStats | None:
        return next((p for p in self.phases if p.phase.name == name), None)


def _sel(model: str, extra: str = "") -> str:
    label = f'{names.L_MODEL}="{_escape(model)}"'
    return "{" + label + (f",{extra}" if extra else "") + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


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
        self.req = req
        self.span = req.end - req.start
        self.step = max(1.0, math.ceil(self.span / MAX_POINTS_PER_SERIES))

    # -- what is there ----------------------------------------------------------------------------

    def models(self) -> dict[str, float]:
        """Models with prefixwatch series in the range, with their query tokens."""
        found = self.client.query(
            f"sum by ({names.L_MODEL}) (increase({QUERIES}[{_dur(self.span)}]))"
            f" or sum by ({names.L_MODEL}) (last_over_time({QUERIES}[{_dur(self.span)}]) * 0)",
            self.req.end)
        return {s.labels.get(names.L_MODEL, ""): s.samples[0][1] for s in found}

    def pick_model(self) -> tuple[str, list[str]]:
        models = self.models()
        if not models:
            raise ReportError(
                f"no prefixwatch series ({QUERIES}) in Prometheus at {self.client.base} between "
                f"{_iso(self.req.start)} and {_iso(self.req.end)}: is the exporter scraped, "
                "and is the range right?")
        known = sorted(models)
        if self.req.model is not None:
            if self.req.model not in models:
                raise ReportError(f"model {self.req.model!r} is unknown in that range; "
                                  f"known: {', '.join(known)}")
            return self.req.model, known
        return max(models, key=lambda m: (models[m], m)), known

    def scrape_interval(self, model: str) -> float:
        counts = self.client.query(
            f"count_over_time({QUERIES}{_sel(model)}[{_dur(self.span)}])", self.req.end)
        best = max((s.samples[0][1] for s in counts), default=0.0)
        return self.span / best if best > 1 else self.span / 10

    # -- series ---------------------------------------------------------------------------

    def _range(self, expr: str) -> list[Series]:
        return self.client.query_range(expr, self.req.start, self.req.end, self.step)

    @staticmethod
    def _finite(samples: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(t, v) for t, v in samples if math.isfinite(v)]

    def ratio_series(self, model: str, w: str, by: str = "") -> list[Series]:
        group = f" by ({by})" if by else ""
        return self._range(f"sum{group} (rate({HITS}{_sel(model)}[{w}])) / "
                           f"(sum{group} (rate({QUERIES}{_sel(model)}[{w}])) > 0)")

    def ttft_series(self, model: str, w: str) -> dict[float, list[tuple[float, float]]]:
        out = {}
        for q in TTFT_QUANTILES:
            found = self._range(f"histogram_quantile({q}, sum by (le) "
                                f"(rate({TTFT_BUCKET}{_sel(model)}[{w}])))")
            if found:
                out[q] = self._finite(found[0].samples)
        return out

    def alert_firings(self, model: str) -> list[AlertFiring]:
        span = _dur(self.span)
        sel = f'alertname=~"{ALERT_PATTERN}"'
        firing = self.client.query(f'ALERTS{{{sel},alertstate="firing"}}[{span}]', self.req.end)
        for_state = self.client.query(f"ALERTS_FOR_STATE{{{sel}}}[{span}]", self.req.end)
        firing = [s for s in firing if s.labels.get(names.L_MODEL, model) == model]
        spacing = typical_spacing(s.samples for s in firing + for_state) or self.step
        active: dict[tuple, list[tuple[float, float]]] = {}
        for s in for_state:
            active[_alert_key(s.labels)] = s.samples
        out = []
        for s in firing:
            for iv in runs(s.samples, spacing, self.req.end):
                since = None
                for t, v in active.get(_alert_key(s.labels), []):
                    if t <= iv.start + spacing / 2:
                        since = v
                out.append(AlertFiring(s.labels.get("alertname", "?"),
                                       s.labels.get("severity", ""), s.labels, iv, since))
        return sorted(out, key=lambda a: (a.interval.start, a.name))

    def diagnosis(self, model: str) -> dict[str, list[tuple[str, Interval]]]:
        found = self.client.query(f"{DIAGNOSIS}{_sel(model)}[{_dur(self.span)}]", self.req.end)
        spacing = typical_spacing(s.samples for s in found) or self.step
        out: dict[str, list[tuple[str, Interval]]] = {}
        for s in found:
            cause = s.labels.get(names.L_CAUSE, "?")
            for iv in runs(s.samples, spacing, self.req.end, holds=lambda v: v >= 1):
                out.setdefault(cause, []).append((s.labels.get(names.L_TARGET, ""), iv))
        return {c: sorted(v, key=lambda x: x[1].start) for c, v in sorted(out.items())}

    def tiers(self, model: str, w: str) -> dict[str, list[tuple[float, float]]] | None:
        tiered = _sel(model, L_TIER + '!=""')
        by_tier = self._range(f"sum by ({L_TIER}) (rate({CACHED}{tiered}[{w}]))")
        if not by_tier:
            return None
        out = {s.labels.get(L_TIER, "unknown"): self._finite(s.samples) for s in by_tier}
        out = {t: out[t] for t in (*TIERS, *sorted(set(out) - set(TIERS))) if t in out}
        recomputed = self._range(f"clamp_min(sum(rate({PROMPT}{_sel(model)}[{w}])) - "
                                 f"sum(rate({CACHED}{_sel(model)}[{w}])), 0)")
        if recomputed:
            out["recomputed"] = self._finite(recomputed[0].samples)
        return out

    def ledger(self, model: str, w: str) -> dict[str, list[tuple[float, float]]] | None:
        """Shares of prompt tokens: achieved, the ledger's parts, and the signed remainder."""
        parts = self._range(f"sum by ({L_PART}) (rate({LEDGER}{_sel(model)}[{w}]))")
        if not parts:
            return None
        rates = {s.labels.get(L_PART, ""): dict(self._finite(s.samples)) for s in parts}
        if "prompt" not in rates:
            return None
        achieved_series = self._range(f"sum(rate({CACHED}{_sel(model)}[{w}]))")
        achieved = dict(self._finite(achieved_series[0].samples)) if achieved_series else {}
        out: dict[str, list[tuple[float, float]]] = {
            k: [] for k in ("achieved", *LEDGER_PARTS, "unexplained")}
        for t, prompt in sorted(rates["prompt"].items()):
            if prompt <= 0:
                continue
            got = achieved.get(t, math.nan)
            out["achieved"].append((t, got / prompt))
            for part in LEDGER_PARTS:
                out[part].append((t, rates.get(part, {}).get(t, 0.0) / prompt))
            pool = rates.get("pool_reach", {}).get(t, math.nan)
            out["unexplained"].append((t, (pool - got) / prompt))
        return {k: self._finite(v) for k, v in out.items()}

    # -- phases ---------------------------------------------------------------------------

    def _increase(self, expr_metric: str, model: str, phase: Phase, by: str = "",
                  extra: str = "") -> dict[str, float]:
        group = f" by ({by})" if by else ""
        found = self.client.query(
            f"sum{group} (increase({expr_metric}{_sel(model, extra)}[{_dur(phase.seconds)}]))",
            phase.end)
        return {s.labels.get(by, "") if by else "": s.samples[0][1] for s in found}

    def phase_stats(self, model: str, phase: Phase) -> PhaseStats:
        q = self._increase(QUERIES, model, phase, names.L_TARGET)
        h = self._increase(HITS, model, phase, names.L_TARGET)
        queries, hits = sum(q.values()), sum(h.values())
        prompt = self._increase(PROMPT, model, phase).get("", math.nan)
        cached = self._increase(CACHED, model, phase).get("", math.nan)
        ttft = {}
        for quantile in TTFT_QUANTILES:
            found = self.client.query(
                f"histogram_quantile({quantile}, sum by (le) (increase({TTFT_BUCKET}"
                f"{_sel(model)}[{_dur(phase.seconds)}])))", phase.end)
            value = found[0].samples[0][1] if found else math.nan
            ttft[quantile] = value if math.isfinite(value) else None
        return PhaseStats(phase, ratio(hits, queries), ratio(cached, prompt),
                          {t: ratio(h.get(t, math.nan), q[t]) for t in sorted(q)}, ttft,
                          queries, hits)

    # -- everything -----------------------------------------------------------------------

    def collect(self) -> ReportData:
        req = self.req
        model, known = self.pick_model()
        notes = []
        if req.model is None and len(known) > 1:
            notes.append(f"Several models in range ({', '.join(known)}); this report is on "
                         f"the busiest, {model} (choose with --model).")
        window = req.window or float(math.ceil(max(4 * self.scrape_interval(model), 2 * self.step)))
        w = _dur(window)
        fleet_found = self.ratio_series(model, w)
        fleet = self._finite(fleet_found[0].samples) if fleet_found else []
        replicas = {s.labels.get(names.L_TARGET, "?"): self._finite(s.samples)
                    for s in self.ratio_series(model, w, by=names.L_TARGET)}
        cross = crossings(fleet, req.threshold)
        stats = [self.phase_stats(model, p)
                 for p in phases(req.start, req.end, cross, window) if p.seconds >= window]
        data = ReportData(
            prometheus=self.client.base, model=model, models=known, start=req.start,
            end=req.end, step=self.step, window=window, threshold=req.threshold, fleet=fleet,
            replicas=dict(sorted(replicas.items())), ttft=self.ttft_series(model, w),
            alerts=self.alert_firings(model), diagnosis=self.diagnosis(model), crossings=cross,
            phases=stats, tiers=self.tiers(model, w), ledger=self.ledger(model, w), notes=notes)
        self._incident_cost(data)
        return data

    def _incident_cost(self, data: ReportData) -> None:
        """Prompt tokens recomputed because of the incident: the incident's queries at the
        healthy hit ratio, minus what it hit; in GPU-seconds and money when rates are given."""
        cross, before = data.crossings, data.phase("before")
        firing = merge(a.interval for a in data.alerts)
        if cross.first_drop is None:
            return
        start = max(data.start, cross.first_drop - data.window)
        end = cross.recovery if cross.recovery is not None else data.end
        if firing:
            end = max(end, min(firing[-1].end, data.end))
        data.incident = Interval(start, end, open=cross.recovery is None)
        if before is None or before.hit_ratio is None or end - start < self.step:
            return
        span = Phase("incident", start, end)
        queries = sum(self._increase(QUERIES, data.model, span).values())
        hits = sum(self._increase(HITS, data.model, span).values())
        data.extra_recomputed_tokens = max(0.0, queries * before.hit_ratio - hits)
        if self.req.prefill_tokens_per_second:
            data.gpu_seconds = data.extra_recomputed_tokens / self.req.prefill_tokens_per_second
        if self.req.price_per_million_tokens is not None:
            data.cost = data.extra_recomputed_tokens * self.req.price_per_million_tokens / 1e6


def _alert_key(labels: dict[str, str]) -> tuple:
    return tuple(sorted((k, v) for k, v in labels.items()
                        if k not in ("__name__", "alertstate")))


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
