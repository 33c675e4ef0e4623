"""`prefixwatch status`: the hit ratio right now, for a person at a terminal without Prometheus."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prefixwatch.core.cache.requestledger import table as ledger_table
from prefixwatch.core.diagnosis import RequestEvidence, diagnose, event_evidence
from prefixwatch.core.kv.eventledger import event_table
from prefixwatch.core.kv.poolcurve import verdict
from prefixwatch.core.story import (
    Culprit,
    culprit_of,
    headline,
    percent,
    ratio_name,
    window_words,
)
from prefixwatch.core.vocab import causes, schemas, settings, tiers
from prefixwatch.core.vocab.windows import parse_duration, ratio
from prefixwatch.exporter.config import ExporterConfig
from prefixwatch.exporter.evidence import LEDGER_NEEDS_LOG, evidence_for
from prefixwatch.exporter.monitor import TargetMonitor, WindowFigures
from prefixwatch.exporter.requestlog.reader import RequestsLogReader
from prefixwatch.exporter.requestlog.view import RequestView
from prefixwatch.exporter.service import Exporter


@dataclass
class StatusRow:
    target: str
    model: str
    server: str
    schema: str
    gap_ratio: float | None = None
    lifetime_ratio: float | None = None
    queries_per_s: float | None = None
    ttft_p50: float | None = None
    ttft_p95: float | None = None
    kv_usage: float | None = None
    block_size: int | None = None
    caching_enabled: bool | None = None
    error: str = ""
    #: The KV pool in blocks (cache_config_info num_gpu_blocks), for the ledger.
    pool_blocks: int | None = None
    causes: tuple[str, ...] = ()
    #: Share of prompt tokens served from any tier over the gap, and since the start.
    effective_ratio: float | None = None
    lifetime_effective: float | None = None
    #: Share of the gap's prompt tokens by tier, and "recomputed" for the rest.
    tier_split: dict[str, float] | None = None
    #: What a router target said (its rows have schema ``router``).
    note: str = ""
    #: The gap's figures themselves, for the fleet's ratio (summed before dividing).
    gap: WindowFigures | None = None
    #: What varies early in this model's prompts over the gap, if known.
    culprit: Culprit | None = None


#: The key of a culprit that holds for every model (a request log that names none).
ANY_MODEL = ""
#: What the KV event streams add to the diagnosis over the gap: each model's request evidence
#: (the measured ledger) and culprit.
Story = tuple[dict[str, RequestEvidence], dict[str, Culprit]]


@dataclass(frozen=True)
class FleetLine:
    """One model's story over the gap, the targets summed: the headline every surface shows."""

    model: str
    ratio: float | None
    causes: tuple[str, ...] = ()
    culprit: Culprit | None = None
    targets: list[str] = field(default_factory=list)


def collect_status(config: ExporterConfig, gap: float,
                   story: Callable[[], Story] | None = None) -> list[StatusRow]:
    """Poll every target twice, ``gap`` seconds apart, and derive the figures over the gap.
    ``story``: called after the second poll, what the KV event streams measured over it."""
    windows = {"gap": gap}
    monitors = [TargetMonitor(t, windows, gap, extra_windows=(gap,)) for t in config.targets]
    for mon in monitors:
        mon.poll()
    first = {mon.name: mon.view.router for mon in monitors}
    time.sleep(gap)
    for mon in monitors:
        mon.poll()
    now = time.time()
    views = [mon.view for mon in monitors]
    evidence = {view.name: evidence_for(view, now, gap) for view in views if view.up}
    requests, culprits = story() if story is not None else ({}, {})
    found = diagnose(evidence, requests, config.thresholds, parse_duration(config.cold_start),
                     config.hit_ratio_mode)
    rows: list[StatusRow] = router_rows(views, first)
    for view in views:
        if view.up and view.router is not None:
            continue  # a router: its row is router_rows'
        if not view.up or view.schema is None:
            rows.append(StatusRow(view.name, "-", "-", "-",
                                  error=f"{view.reason}: {view.last_error}"))
            continue
        schema = view.schema
        by_model = view.by_model()
        for model, figures in sorted(view.models.items()):
            states = by_model.get(model, [])
            wf = figures.windows.get("gap")
            kv = [s.values.gauges["kv_usage"] for s in states if "kv_usage" in s.values.gauges]
            blocks = [s.values.block_size for s in states if s.values.block_size]
            enabled = [s.values.caching_enabled for s in states
                       if s.values.caching_enabled is not None]
            lifetime = ratio(figures.lifetime_hits, figures.lifetime_queries)
            if lifetime is None and not schema.windows_supported:
                reported = [s.values.gauges.get("engine_reported_hit_ratio") for s in states]
                lifetime = next((r for r in reported if r is not None), None)
            pools = {s.values.cache_info.get(schemas.CACHE_INFO_NUM_GPU_BLOCKS) for s in states}
            pool = pools.pop() if len(pools) == 1 else None
            rows.append(StatusRow(
                pool_blocks=int(pool) if pool and pool.isdigit() else None,
                target=view.name, model=model, server=schema.server, schema=schema.schema,
                gap_ratio=wf.hit_ratio if wf else None,
                lifetime_ratio=lifetime,
                queries_per_s=(wf.queries / wf.seconds) if wf and wf.seconds > 0 else None,
                ttft_p50=wf.ttft_quantile(0.5) if wf else None,
                ttft_p95=wf.ttft_quantile(0.95) if wf else None,
                kv_usage=max(kv) if kv else None,
                block_size=blocks[0] if blocks else None,
                caching_enabled=all(enabled) if enabled else None,
                causes=tuple(found.active(view.name, model)),
                effective_ratio=wf.effective_ratio if wf else None,
                lifetime_effective=figures.lifetime_effective,
                tier_split=wf.tier_shares() if wf else None,
                gap=wf, culprit=culprits.get(model, culprits.get(ANY_MODEL)),
            ))
    return rows


def router_rows(views: list, first: dict) -> list[StatusRow]:
    """A row per router target: its kind, its workers and the engine targets they matched,
    and what it believed over the gap (its predicted hits over its predictions)."""
    from prefixwatch.exporter.routers.emit import router_views

    rows = []
    for view in router_views(views):
        if not view.up:
            continue
        before = first.get(view.name)
        hits = total = 0.0
        for source, (h, n) in view.reading.predictions.items():
            h0, n0 = before.predictions.get(source, (0.0, 0.0)) if before else (0.0, 0.0)
            hits, total = hits + h - h0, total + n - n0
        believed = f"believed {hits / total:.1%} over the gap" if total > 0 else (
            "no prediction in the gap")
        matched = ", ".join(f"{w} -> {t}" for w, t in sorted(view.matched.items()))
        unmatched = ", ".join(f"{w} ({why})" for w, why in sorted(view.unmatched.items()))
        rows.append(StatusRow(view.name, "-", view.kind, "router", note=(
            f"router: {believed}; workers {matched or 'none matched'}"
            + (f"; unmatched {unmatched}" if unmatched else ""))))
    return rows


def fleet_lines(rows: list[StatusRow], mode: str) -> list[FleetLine]:
    """Each model's ratio over the gap with every target's tokens summed before dividing,
    the causes any of its targets shows, and its culprit."""
    out = []
    engines = [r for r in rows if not r.error and r.schema != "router"]
    for model in sorted({r.model for r in engines}):
        mine = [r for r in engines if r.model == model]
        figures = [r.gap for r in mine if r.gap is not None]
        device = mode == settings.HIT_RATIO_DEVICE
        if figures:
            total = WindowFigures.summed(figures)
            value = total.hit_ratio if device else total.effective_ratio
        else:  # rows without their figures: one target's own ratio, else none
            value = (mine[0].gap_ratio if device else mine[0].effective_ratio
                     ) if len(mine) == 1 else None
        named = tuple(sorted({c for r in mine for c in r.causes}))
        culprit = next((r.culprit for r in mine if r.culprit is not None), None)
        out.append(FleetLine(model, value, named, culprit, [r.target for r in mine]))
    return out


def story_lines(rows: list[StatusRow], gap: float, mode: str) -> list[str]:
    """The answer first: each model's fleet ratio over the gap, cause and culprit."""
    out = []
    for line in fleet_lines(rows, mode):
        scope = "fleet" if len(line.targets) > 1 else line.targets[0]
        out.append(f"{line.model} ({scope}): " + headline(
            ratio_name(mode), line.ratio, window_words(gap), line.causes, line.culprit))
    return out


def _pct(value: float | None) -> str:
    return percent(None if value is not None and math.isnan(value) else value)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None or math.isnan(value) else format(value, fmt)


def render(rows: list[StatusRow], gap: float, mode: str = settings.DEFAULT_HIT_RATIO_MODE
           ) -> str:
    story = story_lines(rows, gap, mode)
    headers = ("TARGET", "MODEL", "ENGINE", f"HIT({gap:g}s)", f"EFF({gap:g}s)", "HIT(life)",
               "EFF(life)", "QTOK/S", "TTFT p50", "TTFT p95", "KV USE", "BLOCK", "NOTE")
    table = [headers]
    for r in rows:
        note = r.error or r.note
        if not note and r.caching_enabled is False:
            note = "prefix caching is OFF"
        elif not note and r.gap_ratio is None:
            note = "no traffic in the gap" if r.schema != "vllm_v0" else "V0: lifetime only"
        table.append((
            r.target, r.model, r.schema, _pct(r.gap_ratio), _pct(r.effective_ratio),
            _pct(r.lifetime_ratio), _pct(r.lifetime_effective), _num(r.queries_per_s, ".0f"),
            _num(r.ttft_p50, ".3f") + ("s" if r.ttft_p50 is not None else ""),
            _num(r.ttft_p95, ".3f") + ("s" if r.ttft_p95 is not None else ""),
            _pct(r.kv_usage), _num(r.block_size, "d") if r.block_size else "-", note))
    widths = [max(len(str(row[i])) for row in table) for i in range(len(headers))]
    lines = [*story, *([""] if story else []), *(
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in table)]
    split = [r for r in rows if r.tier_split]
    if split:
        lines += ["", f"Prompt tokens by cache tier over the {gap:g}s gap (HIT is the device "
                      "tier, EFF every tier; docs/tiers.md):"]
        for r in split:
            assert r.tier_split is not None
            parts = ", ".join(f"{t} {_pct(v)}" for t, v in r.tier_split.items()
                              if v > 0 or t in (tiers.TIER_DEVICE, "recomputed"))
            lines.append(f"  {r.target} {r.model}: {parts}")
    summaries = {c.name: c.summary for c in causes.CAUSES}
    diagnosed = [r for r in rows if not r.error and r.schema != "router"]
    if diagnosed:
        lines += ["", f"Diagnosis over the {window_words(gap)} gap (rules: "
                      "docs/runbooks.md#diagnosis; prefix_divergence and routing_spread need "
                      "--kv-events or a requests_log in the --config file):"]
        for r in diagnosed:
            named = "; ".join(f"{c}: {summaries[c]}" for c in r.causes) or "none diagnosed"
            lines.append(f"  {r.target} {r.model}: {named}")
    return "\n".join(lines)


def read_log(config: ExporterConfig, block_size: int | None = None,
             pool: int | None = None) -> RequestView:
    """The whole request log, read once into a request view (the audit's replay)."""
    assert config.requests_log is not None
    view = RequestView(block_size or 16, pool_blocks=lambda _replica: pool)
    view.ledger.single_replica = len(config.targets) == 1
    rl = config.requests_log
    reader = RequestsLogReader(type(rl)(**{**rl.__dict__, "follow": False}), view,
                               config.targets[0].url if config.targets else None)
    reader.start()
    reader.done.wait()
    reader.stop()
    return view


def log_culprits(config: ExporterConfig, models: list[str]) -> dict[str, Culprit]:
    """The culprit of the request log's requests, for ``models`` (the log names none)."""
    if config.requests_log is None:
        return {}
    found = culprit_of(read_log(config).divergences(math.inf))
    wanted = [config.requests_log.model] if config.requests_log.model else models or [ANY_MODEL]
    return {m: found for m in wanted} if found is not None else {}


def ledger_status(config: ExporterConfig, rows: list[StatusRow]) -> list[str]:
    """The ledger of the whole request log (read once), as a table; or why there is none."""
    if config.requests_log is None:
        return ["", LEDGER_NEEDS_LOG]
    sizes = {r.block_size for r in rows if r.block_size}
    pools = {r.pool_blocks for r in rows if not r.error}
    view = read_log(config, sizes.pop() if len(sizes) == 1 else None,
                    pools.pop() if len(pools) == 1 else None)
    rl = config.requests_log
    totals, unmeasured = view.ledger_totals()
    if not totals.requests:
        return ["", f"Ledger: no request could be read from {rl.path}."]
    return ["", f"Ledger of {rl.path} ({totals.requests} requests; "
                "docs/runbooks.md#the-hit-rate-ledger):",
            *("  " + line for line in ledger_table(totals, totals.achieved, unmeasured))]


class EventLedgerStatus:
    """The ledger from the targets' KV event streams over the status gap: the streams are
    followed from ``start`` (one poll of every target) to ``finish`` (a second one)."""

    def __init__(self, config: ExporterConfig) -> None:
        self.exporter = Exporter(config)
        self.exporter.log_diagnosis = False  # status prints the diagnosis itself
        self.exporter.kv.start()
        self.exporter.poll_round()  # the baseline: the counters as the streams start
        self.started = time.time()
        self.polled = False

    def story(self) -> Story:
        """What the streams measured since the baseline: each model's ledger as request
        evidence, and its culprit (the divergences named so far, the pending ones too)."""
        exp = self.exporter
        exp.poll_round()
        self.polled = True
        exp.kv.name_pending()
        requests = {}
        for model in exp.kv_ledgers.models():
            span = exp.kv_ledgers.model_span(model, None)
            if span is not None and span.prompt > 0:
                requests[model] = event_evidence(span.shares, span.prompt, span.requests)
        # A short gap sees few chains from their start (the first blocks were stored before
        # the streams were followed, so their positions are unknown): a followed request log
        # (requests_log with follow: true) names the culprit then, from the gap's requests.
        return requests, exp.culprits(time.time(), time.time() - self.started)

    def finish(self) -> list[str]:
        exp = self.exporter
        try:
            if not self.polled:
                exp.poll_round()
            lines = ["", "Ledger from the KV event streams, over the gap (where the prompt "
                         "tokens went; docs/runbooks.md#the-hit-rate-ledger):"]
            for name, source in exp.kv.sources.items():
                span = exp.kv_ledgers.span(name, None)
                stream = source.view()
                snap = stream.snapshot
                if span is None or snap is None:
                    lines.append(f"  {name}: no KV event received "
                                 f"({'subscribed' if stream.up else 'not connected'})")
                    continue
                lines.append(f"  {name} ({snap.model}; {span.requests} requests, "
                             f"{stream.lost} messages lost):")
                lines += ["    " + line for line in event_table(span.shares, span.prompt)]
                curve = exp.kv_ledgers.whatif.curve([name], None)
                if curve is not None:  # the pool what-if over the same gap
                    lines.append(f"    KV pool: {verdict(curve, span.shares)}")
            lines += ladder_status(exp)
            return lines
        finally:
            exp.kv.stop()


def ladder_status(exp) -> list[str]:
    """Each model's ladder over the gap (its targets summed): what each fix is worth."""
    from prefixwatch.core.kv.ladder import ladder
    from prefixwatch.core.kv.ladder import lines as ladder_lines

    out = []
    for model in sorted(exp.kv_ledgers.models()):
        span = exp.kv_ledgers.model_span(model, None)
        rungs = (ladder(span.shares, span.prompt, exp.kv_ledgers.whatif.capacity(model, None))
                 if span is not None else {})
        if rungs:
            out += ["", f"The ladder of {model} (hit ratio with each fix added; "
                        "docs/routers.md#the-ladder):", *("  " + line
                                                        for line in ladder_lines(rungs))]
    return out


def event_ledger_status(config: ExporterConfig) -> EventLedgerStatus | None:
    """Follow the event streams during ``status`` when a target names one (None: none)."""
    if not any(t.kv_events for t in config.targets) and config.kv_events_listen is None:
        return None
    return EventLedgerStatus(config)
