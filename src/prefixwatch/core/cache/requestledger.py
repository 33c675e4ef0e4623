"""The hit-rate ledger: where every prompt token of a window went, in parts that add up.

For each request r (p_r prompt tokens, block size B, vLLM's rule: whole blocks within the first
p_r - 1 tokens, same extra keys), in arrival order:

- ``fleet_reach``: what an unlimited cache over the window's earlier requests would serve (the
  request view's own prefix index: no second pass);
- ``replica_reach``: the same over the earlier requests of r's replica (one sliding index per
  replica, holding exactly the fleet window's requests of that replica, so it never exceeds
  ``fleet_reach``);
- ``pool_reach``: what the replica's pool would serve, an LRU replay over its block count
  (``core.blockcache.BlockPool``), never above ``replica_reach``;
- ``layout``: the part of the unshared content a prompt-layout fix would recover: when r leaves
  its closest earlier sibling at token d for a span of at most ``LAYOUT_SPAN`` tokens after
  which both continue identically for at least one full block, the whole blocks up to the end
  of that identical run, beyond ``fleet_reach``.

Parts, in tokens: ``novel = p - fleet_reach - layout``, ``routing = fleet_reach -
replica_reach``, ``eviction = replica_reach - pool_reach``, so that ``prompt = novel + layout +
routing + eviction + pool_reach`` for every request, and with the engine's cached tokens
(``achieved``), ``unexplained = pool_reach - achieved`` (signed) closes
``prompt = achieved + novel + layout + routing + eviction + unexplained`` to the token.

What cannot be measured is not guessed: without a replica per request ``routing`` is 0 and
not ``measured`` (it stays in ``unexplained``); without a pool size, ``pool_reach`` equals
``replica_reach`` and ``eviction`` is not ``measured`` either.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefixwatch.core.cache.cacherule import cached_tokens_for
from prefixwatch.core.cache.layoutpart import LAYOUT_SPAN, layout_end
from prefixwatch.core.cache.prefixindex import Divergence, Entry, PrefixIndex, RequestResult
from prefixwatch.core.vocab import exposition

if TYPE_CHECKING:
    from prefixwatch.core.cache.blockcache import BlockPool

__all__ = ["COUNTED", "LAYOUT_SPAN", "SHARES", "Ledger", "Parts", "ratios", "shares", "table"]

#: Ledger parts as counters (``prompt`` and ``pool_reach`` close the identity), and the shares
#: of the prompt tokens in the order a table prints them (they sum to 1).
COUNTED: tuple[str, ...] = exposition.LEDGER_COUNTED
SHARES: tuple[str, ...] = exposition.LEDGER_SHARES


_ANSWER_BIT = 1 << 63
_ID_MASK = _ANSWER_BIT - 1


@dataclass(slots=True)
class Parts:
    """One request's ledger (or a sum of them), in tokens."""

    prompt: int = 0
    novel: int = 0
    layout: int = 0
    routing: int = 0
    eviction: int = 0
    pool_reach: int = 0
    #: Cached tokens the engine reported for the request(s); None when not known.
    achieved: int | None = None
    requests: int = 0

    def __iadd__(self, other: Parts) -> Parts:
        if self.requests == 0:
            self.achieved = other.achieved
        elif self.achieved is None or other.achieved is None:
            self.achieved = None  # one request without it: the sum is not known
        else:
            self.achieved += other.achieved
        self.prompt += other.prompt  # field by field: once a request, on the audit's path
        self.novel += other.novel
        self.layout += other.layout
        self.routing += other.routing
        self.eviction += other.eviction
        self.pool_reach += other.pool_reach
        self.requests += other.requests
        return self

    def check(self) -> None:
        """The identity without ``achieved``: raises AssertionError if a part is lost."""
        total = self.novel + self.layout + self.routing + self.eviction + self.pool_reach
        if total != self.prompt or min(self.novel, self.layout, self.routing,
                                       self.eviction, self.pool_reach) < 0:
            raise AssertionError(f"ledger does not add up: {self}")


def shares(parts: Parts, achieved: int | None = None) -> dict[str, int]:
    """The six parts in tokens, ``unexplained = pool_reach - achieved``; they sum to prompt.

    ``achieved`` (the engine's counters over the same window) overrides the parts' own."""
    got = parts.achieved if achieved is None else achieved
    if got is None:
        raise ValueError("the ledger needs the achieved (cached) tokens")
    return {"achieved": got, "novel": parts.novel, "layout": parts.layout,
            "routing": parts.routing, "eviction": parts.eviction,
            "unexplained": parts.pool_reach - got}


def ratios(parts: Parts, achieved: int | None = None) -> dict[str, float]:
    """The six shares of the prompt tokens (summing to 1); empty without prompt tokens."""
    if parts.prompt <= 0:
        return {}
    return {k: v / parts.prompt for k, v in shares(parts, achieved).items()}


@dataclass(slots=True)
class _Row:
    at: float
    replica: Hashable
    parts: Parts | None  # None: warm history, in the indexes but not counted


class Ledger:
    """The ledger of one request log, fed by the request view after each ``add_timed``.

    ``pool_blocks(replica)`` gives a replica's KV block count (num_gpu_blocks) or None.
    """

    def __init__(self, block_size: int,
                 pool_blocks: Callable[[Hashable], int | None] | None = None) -> None:
        self.bs = block_size
        self.pool_blocks = pool_blocks or (lambda _replica: None)
        self.replicas: dict[Hashable, PrefixIndex] = {}
        self.pools: dict[Hashable, BlockPool | None] = {}
        self.rows: deque[_Row] = deque()
        self._answers = 0  # ids of answer blocks: no prompt ever chains to them
        self.totals = Parts()
        self.routing_measured = False
        self.eviction_measured = False
        #: The log's requests all go to one replica: routing is 0, not unknown.
        self.single_replica = False

    # -- feeding -------------------------------------------------------------------------------

    def account(self, index: PrefixIndex, q: Sequence[int], extra_keys: Hashable,
                entry: Entry | RequestResult, divergence: Divergence | None,
                replica: Hashable = None, cached: int | None = None, warm: bool = False,
                output: int | None = None) -> Parts | None:
        """The ledger of the request just added to ``index`` (the view's window) as ``entry``.

        ``q`` is the request's tokens as the index holds them; ``replica`` its replica (None:
        unknown); ``cached`` the engine's cached tokens for it when the log carries them;
        ``output`` the tokens it generates (max_tokens), whose blocks the pool holds too.
        With a whole-log index (the audit's) nothing leaves: no rows are kept."""
        at = entry.at if isinstance(entry, Entry) else 0.0
        p, bs = entry.prompt_tokens, self.bs
        fleet = entry.cacheable_tokens
        if replica is None:
            own = fleet
        else:
            rindex = self.replicas.get(replica)
            if rindex is None:
                bound = (index.max_requests or len(index.window) + 1) + 1
                rindex = self.replicas[replica] = PrefixIndex(
                    bs, bound if index.sliding else None, packed=index.packed)
            own = rindex.insert(q, extra_keys, at).cacheable_tokens
        pool = self._pool(replica)
        reach = own if pool is None else min(self._replay(pool, q, extra_keys, output or 0), own)
        layout = 0
        if divergence is not None and p - fleet >= bs:
            end = layout_end(index, q, extra_keys, divergence.position)
            if end:
                layout = max(0, cached_tokens_for(p, end // bs, bs) - fleet)
        parts = Parts(p, p - fleet - layout, layout, fleet - own, own - reach, reach,
                      cached, 1)
        if index.sliding:
            self.rows.append(_Row(at, replica, None if warm else parts))
            self._follow(index)
        if warm:
            return None
        if replica is not None:
            self.routing_measured = True
        if pool is not None:
            self.eviction_measured = True
        self.totals += parts
        return parts

    def _replay(self, pool: BlockPool, q: Sequence[int], extra_keys: Hashable, output: int
                ) -> int:
        """One request through the pool as the engine runs it: its prompt's blocks, then the
        blocks its answer fills (cached, as vLLM caches every full block), then release."""
        admitted = pool.admit(q, extra_keys)
        if admitted is None:
            return 0  # the prompt does not fit in the pool at all
        held, path, p, bs = admitted.blocks, admitted.path, len(q), self.bs
        if output > 0:
            total = -(-(p + output - 1) // bs)
            extra = min(total - len(held), pool.num_free)
            if extra > 0:
                held = held + pool.allocate(extra)
            parent = path[-1] if path else pool.root(extra_keys)
            for i in range(len(path), min((p + output - 1) // bs, len(held))):
                self._answers = (self._answers + 1) & _ID_MASK
                parent = pool.cache_id(parent, self._answers | _ANSWER_BIT, held[i])
        pool.release(held)
        return admitted.cached_tokens

    def _pool(self, replica: Hashable) -> BlockPool | None:
        if replica in self.pools:
            return self.pools[replica]
        blocks = self.pool_blocks(replica)
        if blocks is None or blocks < 2:
            return None  # asked again next time: the size may be known by then
        from prefixwatch.core.cache.blockcache import BlockPool  # only with a pool size

        pool = self.pools[replica] = BlockPool(blocks, self.bs)
        return pool

    def _follow(self, index: PrefixIndex) -> None:
        """Drop, per replica, what the fleet window dropped after matching this request, so
        each replica index holds exactly the fleet window's requests of that replica."""
        while len(self.rows) > len(index.window):
            row = self.rows.popleft()
            if row.replica is not None:
                rindex = self.replicas[row.replica]
                rindex.drop_oldest()
                if not rindex.window:
                    del self.replicas[row.replica]

    def reset(self, block_size: int) -> None:
        """The view started a new window (a new block size): indexes and pools start again."""
        self.bs = block_size
        self.replicas.clear()
        self.pools.clear()
        self.rows.clear()

    # -- reading -------------------------------------------------------------------------------

    def window(self, since: float) -> Parts:
        """The sum of the parts of the requests that arrived at or after ``since``."""
        out = Parts()
        for row in reversed(self.rows):
            if row.at < since:
                break
            if row.parts is not None:
                out += row.parts
        return out

    def unmeasured(self) -> tuple[str, ...]:
        """Parts that cannot be told apart here (they stay in ``unexplained``)."""
        out = []
        if not self.routing_measured and not self.single_replica:
            out.append("routing")
        if not self.eviction_measured:
            out.append("eviction")
        return tuple(out)


def table(parts: Parts, achieved: int | None, unmeasured: Sequence[str]) -> list[str]:
    """The ledger as text rows (part, tokens, share of the prompt tokens), for the audit and
    ``prefixwatch status``; parts that cannot be measured say so instead of a number."""
    p = parts.prompt
    rows = [f"{'PART':<12} {'TOKENS':>12} {'SHARE':>7}"]

    def row(name: str, value: int | None, note: str = "") -> None:
        share = f"{value / p:7.1%}" if value is not None and p else f"{'-':>7}"
        shown = f"{value:>12}" if value is not None else f"{'-':>12}"
        rows.append(f"{name:<12} {shown} {share}{'  ' + note if note else ''}")

    folded = " (in unexplained)"
    row("prompt", p)
    row("achieved", achieved, "" if achieved is not None else
        "unknown: the engine's cached tokens are needed")
    row("novel", parts.novel, "no earlier request shares it")
    row("layout", parts.layout, "a prompt-layout fix would share it")
    row("routing", None if "routing" in unmeasured else parts.routing,
        "not separable: no replica per request" + folded if "routing" in unmeasured
        else "cached on another replica")
    row("eviction", None if "eviction" in unmeasured else parts.eviction,
        "not separable: the pool size is unknown" + folded if "eviction" in unmeasured
        else "the replica's pool lost it")
    if achieved is None:
        row("pool_reach", parts.pool_reach, "what the pool would serve")
    else:
        row("unexplained", parts.pool_reach - achieved,
            "pool_reach - achieved: preemption, another pool size, unlogged traffic")
    return rows
