"""The ledger from the event source: the engines' counters beside the streams' parts.

At every tick each source with a mirror is sampled together with its target's lifetime
counters (prompt tokens, cached tokens of every tier, requests); a span's ledger is the
difference of two samples, so both sides cover the same stretch of time, and it starts when
the exporter first saw both (what an engine did before its stream was followed is not in it).
An engine restart (its counters fall) starts the target's history again.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

from prefixwatch.core import names
from prefixwatch.core.ledger import event_shares
from prefixwatch.exporter.kvevents.source import KvSource
from prefixwatch.exporter.monitor import TargetMonitor


@dataclass(frozen=True)
class Sample:
    at: float
    prompt: float
    cached: float
    requests: float
    computed: dict[str, int]


@dataclass(frozen=True)
class Span:
    """One target's (or a model's summed) ledger over a span, in tokens."""

    prompt: int
    requests: int
    shares: dict[str, int]


def _counters(mon: TargetMonitor, model: str) -> tuple[float, float, float] | None:
    """Lifetime (prompt, cached every tier, requests) of one model on a target, or None."""
    with mon.lock:
        if not mon.up:
            return None
        figures = mon.models.get(model)
        if figures is None or math.isnan(figures.lifetime_queries):
            return None
        cached = (sum(figures.lifetime_tiers.values()) if figures.lifetime_tiers
                  else figures.lifetime_hits)
        requests = 0.0
        for (m, _engine), state in mon.series.items():
            hist = state.values.histograms.get("prompt_len") if m == model else None
            if hist is not None:
                requests += hist.count
        return figures.lifetime_queries, cached, requests


class EventLedgers:
    def __init__(self, sources: dict[str, KvSource], monitors: list[TargetMonitor],
                 horizon: float) -> None:
        self.sources = sources
        self.monitors = {m.name: m for m in monitors}
        self.horizon = horizon
        self.lock = threading.Lock()
        self._history: dict[str, deque[Sample]] = {}
        self._first: dict[str, Sample] = {}
        self._written: dict[str, dict[str, int]] = {}

    def sample(self, now: float) -> None:
        for name, source in self.sources.items():
            mon = self.monitors.get(name)
            mirror = source.mirror
            if mon is None:
                continue
            if mirror is None:  # nothing received yet: the baseline, with nothing computed
                model = source.model_hint()
                computed = dict.fromkeys(names.KV_COMPUTED_PARTS, 0)
            else:
                snap = mirror.snapshot()
                model, computed = snap.model, snap.computed
            got = _counters(mon, model) if model else None
            if got is None:
                continue
            sample = Sample(now, *got, computed)
            with self.lock:
                ring = self._history.setdefault(name, deque())
                restarted = bool(ring) and sample.prompt < ring[-1].prompt
                if restarted:  # the engine restarted
                    ring.clear()
                    self._first.pop(name, None)
                ring.append(sample)
                self._first.setdefault(name, sample)
                while len(ring) > 2 and ring[1].at < now - self.horizon:
                    ring.popleft()
            span = self.span(name, None)
            tail = span.shares[names.LEDGER_TAIL] if span is not None else 0
            # The tail part of the target's computed-token counter: since the first sample,
            # never going down while the engine runs (the stream and the counters are read at
            # different moments), back to 0 when it restarts (a counter reset).
            source.tail_tokens = tail if restarted else max(source.tail_tokens, tail)

    def models(self) -> dict[str, list[str]]:
        """model -> the targets whose event ledger has at least one sample."""
        out: dict[str, list[str]] = {}
        with self.lock:
            names_ = list(self._history)
        for name in names_:
            mirror = self.sources[name].mirror  # a stream that never spoke has no ledger
            if mirror is not None and mirror.fleet.model:
                out.setdefault(mirror.fleet.model, []).append(name)
        return out

    def span(self, target: str, seconds: float | None) -> Span | None:
        """The target's ledger over the last ``seconds`` (None: since the first sample)."""
        with self.lock:
            ring = self._history.get(target)
            if not ring:
                return None
            last = ring[-1]
            start = self._first[target]
            if seconds is not None:
                since = last.at - seconds
                start = ring[0]
                for s in ring:
                    if s.at > since:
                        break
                    start = s
        mirror = self.sources[target].mirror
        bs = mirror.block_size if mirror is not None else 16
        prompt = round(last.prompt - start.prompt)
        requests = round(last.requests - start.requests)
        computed = {p: last.computed[p] - start.computed[p] for p in names.KV_COMPUTED_PARTS}
        return Span(prompt, requests, event_shares(
            prompt, round(last.cached - start.cached), computed, requests, bs))

    def counters(self, model: str, counted: dict[str, int]) -> dict[str, int]:
        """The model's ledger counters as written: each never lower than it was. The stream
        and the engines' counters are read at different moments, and blocks of generated
        tokens (vLLM caches those too) can make the stream's parts outgrow the prompt's for a
        while, so ``pool_reach`` (and the tail) can dip; a counter that fell would read as a
        reset, and a rate over it as a burst of the whole value."""
        with self.lock:
            written = self._written.setdefault(model, {})
            for part, n in counted.items():
                written[part] = max(written.get(part, n), n)
            return dict(written)

    def model_span(self, model: str, seconds: float | None) -> Span | None:
        """A model's ledger summed over its targets (before any share is taken)."""
        spans = [s for t in self.models().get(model, []) if (s := self.span(t, seconds))]
        if not spans:
            return None
        shares = {k: sum(s.shares[k] for s in spans) for k in spans[0].shares}
        return Span(sum(s.prompt for s in spans), sum(s.requests for s in spans), shares)
