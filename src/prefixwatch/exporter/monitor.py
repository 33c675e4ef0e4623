"""One monitored target: poll, keep history, derive window ratios, remember what went wrong.

A target never takes the exporter down: every failure becomes ``up=0`` with a reason, counted
in ``scrape_errors``, and logged once when the state changes (not on every poll).
The window math lives in core/vocab/windows.py. Readers see a target only through its TargetView,
published whole at the end of each poll; what the diagnosis needs of a target is read from
that view by exporter/evidence.py.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from array import array
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from prefixwatch.core.version import __version__
from prefixwatch.core.vocab import exposition, families, tiers
from prefixwatch.core.vocab.schemas import SourceSchema
from prefixwatch.core.vocab.windows import (
    HistoryView,
    SeriesHistory,
    VectorLayout,
    histogram_quantile,
    plan_tiers,
    ratio,
    sum_vectors,
)
from prefixwatch.exporter.config import TargetConfig
from prefixwatch.exporter.pagereader import (
    CACHED,
    TIER_ROLES,
    TIER_STORES,
    LabelCache,
    PageError,
    PageLimits,
    SeriesKey,
    SeriesValues,
    Snapshot,
    read_page,
)
from prefixwatch.exporter.scrape import Aborted, Fetcher

log = logging.getLogger("prefixwatch.exporter")

#: The history keeps every counter role of the family table, each tier's cached tokens and the
#: second tier's stores, then the histograms' buckets.
COUNTER_ROLES: tuple[str, ...] = (*families.roles("counter"), *TIER_ROLES.values(), CACHED,
                                  TIER_STORES)
HISTOGRAM_ROLES: tuple[str, ...] = families.roles("histogram")


@dataclass(frozen=True)
class WindowFigures:
    """What one window says about one (target, model) or one model's fleet."""

    seconds: float
    queries: float
    hits: float
    ttft_buckets: tuple[tuple[float, ...], list[float]] | None = None
    #: Cached prompt tokens by tier (core.tiers.TIERS); empty when the engine shows none.
    tiers: dict[str, float] = field(default_factory=dict)

    @property
    def hit_ratio(self) -> float | None:
        """The device pool's ratio, as the engine counts its hits."""
        return ratio(self.hits, self.queries)

    @property
    def cached(self) -> float:
        """Prompt tokens served from any tier (NaN when the engine shows no tiers)."""
        return sum(self.tiers.values()) if self.tiers else math.nan

    @property
    def effective_ratio(self) -> float | None:
        """Share of the prompt tokens that looked up the cache served from any tier."""
        return ratio(self.cached, self.queries)

    @classmethod
    def summed(cls, figures: Sequence[WindowFigures]) -> WindowFigures:
        """Several targets' figures of one window summed before any division (the fleet's);
        a target without tiers leaves the sum without tiers."""
        tiers_ = ({t: sum(f.tiers[t] for f in figures) for t in tiers.TIERS}
                  if figures and all(f.tiers for f in figures) else {})
        return cls(max((f.seconds for f in figures), default=0.0),
                   sum(f.queries for f in figures), sum(f.hits for f in figures), tiers=tiers_)

    def ttft_quantile(self, q: float) -> float | None:
        return None if self.ttft_buckets is None else histogram_quantile(q, *self.ttft_buckets)

    def tier_shares(self) -> dict[str, float] | None:
        """Each tier's share of the window's prompt tokens, and the recomputed rest (None:
        no tiers, or no tokens)."""
        if not self.tiers or not self.queries > 0:
            return None
        shares = {t: self.tiers[t] / self.queries for t in tiers.TIERS}
        shares["recomputed"] = max(1.0 - sum(shares.values()), 0.0)
        return shares


@dataclass(frozen=True)
class ModelFigures:
    """Derived figures for one model on one target (summed over its engines)."""

    model: str
    windows: dict[str, WindowFigures] = field(default_factory=dict)
    lifetime_queries: float = math.nan
    lifetime_hits: float = math.nan
    lifetime_tiers: dict[str, float] = field(default_factory=dict)

    @property
    def lifetime_effective(self) -> float | None:
        """The effective ratio since the engines started (None without tiers or queries)."""
        if not self.lifetime_tiers:
            return None
        return ratio(sum(self.lifetime_tiers.values()), self.lifetime_queries)


@dataclass(frozen=True)
class SeriesState:
    """One (model, engine) series as the last poll left it: its values and its history."""

    values: SeriesValues
    history: HistoryView | None


@dataclass(frozen=True)
class TargetView:
    """What one target's readers see of it: the monitor publishes a new view at the end of
    each poll, whatever its outcome, and swaps it in whole, so a reader takes no lock and
    never sees half a poll. Nothing in it changes after it is published."""

    target: TargetConfig
    up: bool = False
    polled: bool = False
    #: Why the last poll failed (a scrape error reason), and its detail.
    reason: str | None = None
    last_error: str = "not polled yet"
    #: What the last page lost to a limit ("" when nothing): shown on the landing page.
    limit_note: str = ""
    scrape_duration: float = math.nan
    last_success: float = math.nan
    #: time.monotonic() when the last poll ended, whatever its outcome (for /healthz).
    last_polled: float | None = None
    errors: Mapping[str, int] = field(default_factory=lambda: MappingProxyType(
        dict.fromkeys(exposition.SCRAPE_ERROR_REASONS, 0)))
    #: The engine generation of the last page read (None before the first).
    schema: SourceSchema | None = None
    series: Mapping[SeriesKey, SeriesState] = field(default_factory=lambda: _EMPTY)
    models: Mapping[str, ModelFigures] = field(default_factory=lambda: _EMPTY)
    #: When the exporter saw each series' counters reset (its engine restarted).
    last_reset: Mapping[SeriesKey, float] = field(default_factory=lambda: _EMPTY)
    #: Each model's gauges over the diagnosis' span: (time, kv usage, waiting requests).
    gauges: Mapping[str, tuple[tuple[float, float, float], ...]] = field(
        default_factory=lambda: _EMPTY)

    @property
    def name(self) -> str:
        return self.target.name

    def by_model(self) -> dict[str, list[SeriesState]]:
        """Each model's series (one per engine)."""
        return _by_model(self.series)


_EMPTY: Mapping = MappingProxyType({})


def layout_for(values: SeriesValues) -> VectorLayout:
    hists = tuple((role, values.histograms[role].bounds) for role in HISTOGRAM_ROLES
                  if role in values.histograms)
    return VectorLayout(COUNTER_ROLES, hists)


def raw_vector(values: SeriesValues, layout: VectorLayout) -> list[float]:
    vec = [values.counters.get(role, math.nan) for role in layout.counters]
    for role, bounds in layout.histograms:
        hist = values.histograms.get(role)
        if hist is None or hist.bounds != bounds:
            vec.extend([math.nan] * (len(bounds) + 2))
        else:
            vec.append(hist.count)
            vec.append(hist.sum)
            vec.extend(hist.counts)
    return vec


class TargetMonitor:
    """One target: polled by one poll at a time, read by anyone through ``view``.

    The poll keeps the history and the counts to itself; at the end of each poll it publishes
    a new TargetView (the only thing readers see), so a scrape, the landing page or the
    diagnosis never waits on a poll and never takes this monitor's lock."""

    def __init__(self, target: TargetConfig, windows: dict[str, float], interval: float,
                 extra_windows: Iterable[float] = ()) -> None:
        self.target = target
        self.name = target.name
        self.windows = windows
        self.interval = interval
        extra = list(extra_windows)
        self._tiers = plan_tiers(list(windows.values()) + extra or [interval], interval)
        # Gauges over the longest extra window (the diagnosis'): (time, kv usage, waiting).
        self._gauge_span = max(extra, default=0.0)
        self._gauges: dict[str, deque[tuple[float, float, float]]] = {}
        self._last_reset: dict[SeriesKey, float] = {}
        self._fetcher: Fetcher | None = None
        self._labels = LabelCache()
        self._limits = PageLimits(target.max_series, target.max_models,
                                  target.max_label_length, target.max_buckets)
        #: Taken by the poll that writes (polls of one target never overlap, but a test or a
        #: one-shot caller may ingest from another thread); readers never take it.
        self._lock = threading.Lock()
        self._errors = dict.fromkeys(exposition.SCRAPE_ERROR_REASONS, 0)
        self._histories: dict[SeriesKey, SeriesHistory | None] = {}
        self._state: tuple[bool, str | None] | None = None
        self._schema: str | None = None
        self._switches: set[tuple[str, str]] = set()  # schema changes already logged
        self._view = TargetView(target)

    @property
    def view(self) -> TargetView:
        """The target as its last poll left it (a new object after each poll)."""
        return self._view

    # -- polling -------------------------------------------------------------------------------

    def poll(self) -> None:
        """Fetch and ingest the page; never raises."""
        if self._fetcher is None:
            self._fetcher = Fetcher(self.target, f"prefixwatch/{__version__}")
        started = time.monotonic()
        try:
            text = self._fetcher.fetch()
        except Aborted:  # the process is stopping: the state stays what the last poll found
            return
        except PageError as exc:
            self._fail(exc, time.monotonic() - started)
            return
        except Exception as exc:  # pragma: no cover - a bug must not stop the other targets
            log.exception("target %s: unexpected error while fetching", self.name)
            self._fail(PageError("connect", f"unexpected: {type(exc).__name__}"),
                       time.monotonic() - started)
            return
        self.ingest(text, time.time(), duration_started=started)

    def ingest(self, text: str, now: float, duration_started: float | None = None) -> None:
        """Read a page's text as if just polled at ``now``; never raises."""
        started = duration_started if duration_started is not None else time.monotonic()
        try:
            snapshot = read_page(text, self._labels, self._limits)
        except PageError as exc:
            self._fail(exc, time.monotonic() - started)
            return
        except Exception as exc:  # pragma: no cover - same as above
            log.exception("target %s: unexpected error while reading the page", self.name)
            self._fail(PageError("parse", f"unexpected: {type(exc).__name__}"),
                       time.monotonic() - started)
            return
        note = ", ".join(f"{n} dropped ({reason})" for reason, n in sorted(
            snapshot.dropped.items()))
        with self._lock:
            series = self._accept(snapshot, now)
            for reason in snapshot.dropped:
                self._errors[reason] = self._errors.get(reason, 0) + 1
            changed = note != self._view.limit_note
            self._view = TargetView(
                self.target, up=True, polled=True, limit_note=note,
                scrape_duration=time.monotonic() - started, last_success=now,
                last_polled=time.monotonic(), errors=MappingProxyType(dict(self._errors)),
                schema=snapshot.schema, series=MappingProxyType(series),
                models=MappingProxyType(self._derive(series, now)),
                last_reset=MappingProxyType(dict(self._last_reset)),
                gauges=MappingProxyType({m: tuple(ring) for m, ring in self._gauges.items()}))
        self._log_state(True, None, "")
        if changed and note:
            log.warning("target %s: over a limit, series left out: %s (docs/configuration.md"
                        "#limits)", self.name, note)

    def _fail(self, exc: PageError, duration: float) -> None:
        with self._lock:
            self._errors[exc.reason] = self._errors.get(exc.reason, 0) + 1
            self._view = replace(
                self._view, up=False, polled=True, reason=exc.reason, last_error=exc.detail,
                scrape_duration=duration, last_polled=time.monotonic(),
                errors=MappingProxyType(dict(self._errors)), models=_EMPTY)
        self._log_state(False, exc.reason, exc.detail)

    def _log_state(self, up: bool, reason: str | None, detail: str) -> None:
        state = (up, reason)
        if state == self._state:
            return
        previous = self._state
        self._state = state
        if up:
            if previous is not None:
                log.info("target %s is up again", self.name)
            else:
                schema = self._view.schema
                log.info("target %s is up (%s)", self.name, schema.schema if schema else "?")
        else:
            log.warning("target %s is down: %s: %s", self.name, reason, detail)

    # -- history and derivation -----------------------------------------------------------------

    def _accept(self, snapshot: Snapshot, now: float) -> dict[SeriesKey, SeriesState]:
        """Add the page to each series' history; the series as readers will see them."""
        schema = snapshot.schema
        if schema.schema != self._schema:
            if self._schema is not None:
                # Once per kind of change: a target that flips between engines on every
                # poll says so once, then quietly (the history restarts each time).
                switch = (self._schema, schema.schema)
                level = logging.DEBUG if switch in self._switches else logging.WARNING
                self._switches.add(switch)
                log.log(level, "target %s changed metric schema: %s -> %s; history restarted",
                        self.name, self._schema, schema.schema)
                self._histories = {}
            elif not schema.windows_supported:
                log.warning("target %s: %s", self.name, schema.note)
            self._schema = schema.schema
        histories: dict[SeriesKey, SeriesHistory | None] = {}
        series: dict[SeriesKey, SeriesState] = {}
        for key, values in snapshot.series.items():
            history = self._histories.get(key)
            if schema.windows_supported:
                layout = layout_for(values)
                if history is None or history.layout != layout:
                    history = SeriesHistory(layout, self._tiers, self.interval)
                created = values.created.get("queries")
                if history.add(now, raw_vector(values, layout), created):
                    self._last_reset[key] = now
                    log.info("target %s: counters of %s/engine %s reset (server restart)",
                             self.name, key[0], key[1])
            histories[key] = history
            series[key] = SeriesState(values, history.view() if history else None)
        self._histories = histories
        if self._gauge_span:
            self._record_gauges(series, now)
        return series

    def _record_gauges(self, series: Mapping[SeriesKey, SeriesState], now: float) -> None:
        by_model = _by_model(series)
        for model, states in by_model.items():
            values = [s.values for s in states]
            usage = [v.gauges["kv_usage"] for v in values if "kv_usage" in v.gauges]
            waiting = [v.gauges["waiting"] for v in values if "waiting" in v.gauges]
            ring = self._gauges.setdefault(model, deque())
            ring.append((now, max(usage) if usage else math.nan,
                         sum(waiting) if waiting else math.nan))
            while ring and ring[0][0] < now - self._gauge_span - self.interval:
                ring.popleft()
        for model in set(self._gauges) - set(by_model):
            del self._gauges[model]

    def _derive(self, series: Mapping[SeriesKey, SeriesState], now: float
                ) -> dict[str, ModelFigures]:
        out: dict[str, ModelFigures] = {}
        for model, states in _by_model(series).items():
            counters = [s.values.counters for s in states]
            windows = {window: wf for window, seconds in self.windows.items()
                       if (wf := window_figures(states, now, seconds)) is not None}
            if all("queries" in c and "hits" in c for c in counters):
                out[model] = ModelFigures(model, windows, sum(c["queries"] for c in counters),
                                          sum(c["hits"] for c in counters), tier_sum(counters))
            else:
                out[model] = ModelFigures(model, windows)
        return out


def _by_model(series: Mapping[SeriesKey, SeriesState]) -> dict[str, list[SeriesState]]:
    out: dict[str, list[SeriesState]] = {}
    for (model, _engine), state in series.items():
        out.setdefault(model, []).append(state)
    return out


def window_figures(states: list[SeriesState], now: float, seconds: float) -> WindowFigures | None:
    """Sum the deltas of a model's engines over one window, before any division."""
    summed = summed_delta(states, now, seconds)
    if summed is None:
        return None
    layout, covered, total = summed
    ttft = hist_delta(layout, total, "ttft")
    return WindowFigures(covered, total[layout.offset_of("queries")],
                         total[layout.offset_of("hits")], ttft[:2] if ttft else None,
                         tier_sum([{r: total[layout.offset_of(r)] for r in TIER_ROLES.values()}]))


def tier_sum(counters: Sequence[dict[str, float]]) -> dict[str, float]:
    """Cached tokens by tier summed over engines; empty when any engine lacks a tier (a sum
    with a hole would understate the effective ratio)."""
    out = tiers.empty_tiers()
    for values in counters:
        for tier, role in TIER_ROLES.items():
            value = values.get(role, math.nan)
            if math.isnan(value):
                return {}
            out[tier] += value
    return out if counters else {}


def hist_delta(layout: VectorLayout, delta: Sequence[float], role: str
                ) -> tuple[tuple[float, ...], list[float], float] | None:
    """(bounds, cumulative counts, sum) of one histogram role inside a delta vector; None when
    the role is absent or any of its buckets is unknown."""
    spot = layout.histogram_slice(role)
    if spot is None:
        return None
    offset, bounds = spot
    counts = list(delta[offset + 2: offset + 2 + len(bounds)])
    if any(math.isnan(c) for c in counts):
        return None
    return bounds, counts, delta[offset + 1]


def summed_delta(states: list[SeriesState], now: float, window: float, older: float = 0.0
                 ) -> tuple[VectorLayout, float, Sequence[float]] | None:
    """(layout, seconds covered, delta vector) of a model's engines summed over
    (now - window - older, now - older]; engines with other buckets are not summed."""
    deltas: list[Sequence[float]] = []
    layout: VectorLayout | None = None
    covered = 0.0
    for state in states:
        if state.history is None:
            continue
        if layout is not None and state.history.layout != layout:
            continue
        recent = state.history.delta(now, window + older)
        if recent is None:
            continue
        seconds, vec = recent
        if older:
            newer = state.history.delta(now, older)
            if newer is None or seconds <= newer[0] + 1e-9:
                continue  # the history does not reach back past the newer window
            seconds -= newer[0]
            vec = array("d", (a - b for a, b in zip(vec, newer[1], strict=True)))
        layout = state.history.layout
        covered = max(covered, seconds)
        deltas.append(vec)
    total = sum_vectors(deltas)
    if total is None or layout is None:
        return None
    return layout, covered, total
