"""The ledger from the event source: the engines' counters beside the streams' parts.

Each target's stream is sampled at each of its polls, beside the counters of the page just
read (prompt tokens, cached tokens of every tier, generated tokens, finished requests,
requests running): its mirror's computed parts are read before the page is fetched and
shortly after it is read (``SETTLE_SECONDS``), and the later reading is kept with how far the
stream moved in between. A span's ledger is the difference of two samples, so both sides
cover the same stretch of time, and it starts when the exporter first saw both (what an
engine did before its stream was followed is not in it). The span's edges bound what the two
sides may differ by (``core/kv/eventledger.py``): a block per request running at an edge, and
what the stream stored while that edge's page was fetched. An engine restart (its counters
fall) starts the target's history again.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass

from prefixwatch.core.kv.eventledger import event_shares
from prefixwatch.core.vocab import exposition
from prefixwatch.exporter.kvsubscriber.source import KvSource
from prefixwatch.exporter.monitor import TargetView

#: How long after a page is read its target's stream is read again: the engine publishes a
#: step's events after the step that moved its counters, and the batch crosses a socket and a
#: thread, so a page can show a request whose blocks have not reached the mirror yet. Read a
#: little later, the stream is ahead of the page instead, by at most what it stored since the
#: reading before the fetch, which bounds the span's edges.
SETTLE_SECONDS = 0.05


@dataclass(frozen=True)
class Counters:
    """One model's lifetime counters on a target, as its last page gave them."""

    prompt: float
    cached: float
    requests: float  # finished (vLLM observes the prompt-length histogram at the finish)
    generated: float | None  # None: the engine has no generation counter
    running: float
    #: The engine (the page's schema): how its stream shows what it computed.
    engine: str = "vllm"


@dataclass(frozen=True)
class Sample:
    at: float
    counters: Counters
    computed: dict[str, int]
    #: Tokens the stream stored while the page was fetched (its two readings' difference).
    moved: int


@dataclass(frozen=True)
class Span:
    """One target's (or a model's summed) ledger over a span, in tokens."""

    prompt: int
    requests: int
    shares: dict[str, int]


def _counters(view: TargetView, model: str) -> Counters | None:
    """One model's lifetime counters in a target's view, or None."""
    if not view.up:
        return None
    figures = view.models.get(model)
    if figures is None or math.isnan(figures.lifetime_queries):
        return None
    cached = (sum(figures.lifetime_tiers.values()) if figures.lifetime_tiers
              else figures.lifetime_hits)
    requests = running = 0.0
    generated: float | None = None
    for (m, _engine), state in view.series.items():
        if m != model:
            continue
        values = state.values
        hist = values.histograms.get("prompt_len")
        if hist is not None:
            requests += hist.count
        requests += values.counters.get("finished_requests", 0.0)  # SGLang counts them
        if "generation_tokens" in values.counters:
            generated = (generated or 0.0) + values.counters["generation_tokens"]
        running += values.gauges.get("running", 0.0)
    engine = view.schema.server if view.schema is not None else "vllm"
    return Counters(figures.lifetime_queries, cached, requests, generated, running, engine)


def _computed(source: KvSource) -> tuple[str | None, dict[str, int]] | None:
    """(model, computed tokens by part) of a source's mirror now; zeros before its first
    message (the baseline, with nothing computed); None while messages are held for a
    mirror not made yet (the model still unknown): their blocks are in no reading yet,
    though the page may count their requests."""
    stream = source.view()
    snap = stream.snapshot
    if snap is None:
        if stream.messages:
            return None
        return source.model_hint(), dict.fromkeys(exposition.KV_COMPUTED_PARTS, 0)
    return snap.model, snap.computed


class EventLedgers:
    def __init__(self, sources: dict[str, KvSource], horizon: float) -> None:
        self.sources = sources
        self.horizon = horizon
        self.lock = threading.Lock()
        self._history: dict[str, deque[Sample]] = {}
        self._first: dict[str, Sample] = {}
        self._written: dict[str, dict[str, int]] = {}

    def before_poll(self, target: str) -> dict[str, int] | None:
        """The stream's computed parts just before ``target``'s page is fetched."""
        source = self.sources.get(target)
        got = _computed(source) if source is not None else None
        return got[1] if got is not None else None

    def after_poll(self, view: TargetView, before: dict[str, int] | None, now: float) -> None:
        """Sample a target beside the page just read (its view as that poll published it;
        ``before``: ``before_poll``'s)."""
        target = view.name
        source = self.sources.get(target)
        if source is None:
            return
        reading = _computed(source)
        if reading is None:
            return
        model, computed = reading
        got = _counters(view, model) if model else None
        if got is None:
            return
        moved = sum(computed.values()) - sum((before or computed).values())
        self._add(target, source, Sample(now, got, computed, max(moved, 0)))

    def _add(self, name: str, source: KvSource, sample: Sample) -> None:
        with self.lock:
            ring = self._history.setdefault(name, deque())
            restarted = bool(ring) and sample.counters.prompt < ring[-1].counters.prompt
            if restarted:  # the engine restarted
                ring.clear()
                self._first.pop(name, None)
            ring.append(sample)
            self._first.setdefault(name, sample)
            while len(ring) > 2 and ring[1].at < sample.at - self.horizon:
                ring.popleft()
        span = self.span(name, None)
        tail = span.shares[exposition.LEDGER_TAIL] if span is not None else 0
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
        a, b = start.counters, last.counters
        prompt = round(b.prompt - a.prompt)
        requests = round(b.requests - a.requests)
        output = (0 if a.generated is None or b.generated is None
                  else round(b.generated - a.generated) - requests)
        computed = {p: last.computed[p] - start.computed[p] for p in exposition.KV_COMPUTED_PARTS}
        edges = (bs * round(a.running) + last.moved, bs * round(b.running) + start.moved)
        return Span(prompt, requests, event_shares(
            prompt, round(b.cached - a.cached), computed, requests, bs, output, edges,
            engine=b.engine))

    def counters(self, model: str, counted: dict[str, int]) -> dict[str, int]:
        """The model's ledger counters as written: each never lower than it was. The stream
        and the engines' counters move at different moments (requests in flight at the
        span's edges), so ``pool_reach`` and the tail can dip for a while; a counter that
        fell would read as a reset, and a rate over it as a burst of the whole value."""
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
