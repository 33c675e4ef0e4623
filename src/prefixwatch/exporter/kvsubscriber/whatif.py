"""The pool what-if series: each target's device pool, and the cached tokens a larger one would
have given, as counters beside the engine's prompt tokens.

The mirror counts, per pool scale, the prompt tokens its ghosts would have served
(``core/kv/whatif.py``); at each poll the event ledger samples that beside the page's cached
tokens (every tier), so ``prefixwatch_kv_whatif_cached_tokens_total`` is the engine's cached
tokens plus what the larger pool adds, both read at the same poll, and
``rate(whatif) / rate(prompt tokens)`` is the hit ratio that pool would have had. The counter
starts again with the engine (its counters fall: a reset, as Prometheus expects) and never goes
down in between.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prefixwatch.core.kv.poolcurve import LADDER_SCALE, PoolCurve, curve_of, verdict
from prefixwatch.core.kv.whatif import POOL_SCALES
from prefixwatch.core.vocab import exposition, schemas
from prefixwatch.exporter.kvsubscriber.source import KvSource
from prefixwatch.exporter.monitor import TargetView

if TYPE_CHECKING:
    from prefixwatch.exporter.kvsubscriber.ledgerseries import EventLedgers


def page_pool_blocks(view: TargetView) -> int | None:
    """A target's KV pool in blocks from its last page (``num_gpu_blocks`` of
    ``vllm:cache_config_info``, one value over its engines), else None."""
    got = {s.values.cache_info.get(schemas.CACHE_INFO_NUM_GPU_BLOCKS)
           for s in view.series.values()}
    if len(got) == 1 and (value := got.pop()) and value.isdigit() and int(value) > 1:
        return int(value)
    return None


def pool_blocks(view: TargetView) -> int | None:
    """A target's device pool in blocks: its page's, else the config's ``kv_pool_blocks``."""
    return page_pool_blocks(view) or view.target.kv_pool_blocks


def gained_of(source: KvSource) -> dict[str, int]:
    """The mirror's tokens served from ghosts by pool scale (empty: no pool size or mirror)."""
    mirror = source.mirror
    if mirror is None:
        return {}
    with mirror.fleet.lock:
        return mirror.whatif.gained_tokens()


class WhatIfSeries:
    """The what-if counters of every target with an event ledger, never lower than written
    while its engine runs."""

    def __init__(self, ledgers: EventLedgers) -> None:
        self.ledgers = ledgers
        self._written: dict[str, tuple[Any, dict[str, float]]] = {}
        #: Each target's pool size as its last poll gave it (None: not known).
        self.pools: dict[str, int | None] = {}

    def observe(self, source: KvSource, view: TargetView) -> None:
        """After a poll: the target's pool size, kept for its gauge and given to its
        mirror."""
        blocks = pool_blocks(view)
        self.pools[view.name] = blocks
        mirror = source.mirror
        if mirror is not None:
            with mirror.fleet.lock:
                mirror.whatif.set_pool(blocks)

    def counters(self, target: str) -> tuple[str, dict[str, float]] | None:
        """(model, cached tokens by pool scale) of one target, or None before its pool size
        and its first samples."""
        ends = self.ledgers.ends(target)
        source = self.ledgers.sources.get(target)
        if ends is None or source is None or source.mirror is None:
            return None
        first, last = ends
        if not last.gained:
            return None
        values = {s: last.counters.cached + last.gained[s] - first.gained.get(s, 0)
                  for s in POOL_SCALES}
        since, before = self._written.get(target, (None, {}))
        if since is first:  # the same engine: never lower than written
            values = {s: max(v, before.get(s, v)) for s, v in values.items()}
        self._written[target] = (first, values)
        return source.mirror.fleet.model, values

    def curve(self, targets: list[str], seconds: float | None) -> PoolCurve | None:
        """The pool curve of ``targets`` summed over the last ``seconds`` (None: since their
        first samples), or None without a what-if."""
        prompt = cached = 0.0
        gained = dict.fromkeys(POOL_SCALES, 0.0)
        found = False
        for target in targets:
            ends = self.ledgers.ends(target, seconds)
            if ends is None or not ends[1].gained:
                continue
            start, last = ends
            found = True
            prompt += last.counters.prompt - start.counters.prompt
            cached += last.counters.cached - start.counters.cached
            for s in POOL_SCALES:
                gained[s] += last.gained[s] - start.gained.get(s, 0)
        return curve_of(prompt, cached, gained) if found else None

    def capacity(self, model: str, seconds: float | None) -> float | None:
        """The ladder's capacity rung: prompt tokens a pool ``LADDER_SCALE`` times larger
        would have served beyond the engines' over the window (None: no what-if)."""
        curve = self.curve(self.ledgers.models().get(model, []), seconds)
        if curve is None or LADDER_SCALE not in curve.whatif:
            return None
        return curve.gain(LADDER_SCALE) * curve.prompt

    def model_curve(self, model: str, seconds: float | None) -> tuple[PoolCurve, str] | None:
        """A model's curve over its targets and its verdict (the event ledger's parts name
        the missed tokens when memory would not help), or None."""
        curve = self.curve(self.ledgers.models().get(model, []), seconds)
        if curve is None:
            return None
        span = self.ledgers.model_span(model, seconds)
        return curve, verdict(curve, span.shares if span is not None else None)

    def target_words(self, target: str, seconds: float | None) -> str | None:
        """One target's curve in a sentence over the last ``seconds`` (None: no what-if)."""
        curve = self.curve([target], seconds)
        if curve is None:
            return None
        span = self.ledgers.span(target, seconds)
        return verdict(curve, span.shares if span is not None else None)

    def rows(self) -> Iterator[tuple[exposition.OutMetric, list[str], float]]:
        for target in sorted(self.ledgers.sources):
            pool = self.pools.get(target)
            if pool is not None:
                yield exposition.OUT_KV_POOL_BLOCKS, [target], float(pool)
            got = self.counters(target)
            if got is None:
                continue
            model, values = got
            for scale in POOL_SCALES:
                yield exposition.OUT_KV_WHATIF, [target, model, scale], float(values[scale])


def add_whatif_families(family, ledgers: EventLedgers) -> None:
    """Add the pool and what-if families (``family(metric)`` -> Metric); both present, if
    empty, whenever a target has an event source."""
    family(exposition.OUT_KV_POOL_BLOCKS)
    family(exposition.OUT_KV_WHATIF)
    for metric, labels, value in ledgers.whatif.rows():
        family(metric).add_metric(labels, value)
