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

from array import array
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefixwatch.core import names
from prefixwatch.core.cacherule import cached_tokens_for
from prefixwatch.core.prefixindex import Divergence, Entry, Node, PrefixIndex, RequestResult

if TYPE_CHECKING:
    from prefixwatch.core.blockcache import BlockPool

#: The longest varying span (tokens) a layout fix is credited for: a date, an id, a name.
LAYOUT_SPAN = 64
#: Ledger parts as counters (``prompt`` and ``pool_reach`` close the identity), and the shares
#: of the prompt tokens in the order a table prints them (they sum to 1).
COUNTED: tuple[str, ...] = names.LEDGER_COUNTED
SHARES: tuple[str, ...] = names.LEDGER_SHARES


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
        from prefixwatch.core.blockcache import BlockPool  # only with a pool size

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


def layout_end(index: PrefixIndex, q: Sequence[int], extra_keys: Hashable, d: int) -> int:
    """Where the identical run after a short varying span ends (0: no such run).

    ``q`` was just added to ``index`` and left the earlier requests at token ``d``: its
    closest earlier sibling is the most recent other branch there. A span of at most
    ``LAYOUT_SPAN`` tokens on either side may differ; then both must agree for a full block.

    Only the sibling's first ``LAYOUT_SPAN`` + one block of tokens are copied (the needle
    search); the identical run after them is measured along the trie's own edges, with
    slices of ``q`` in the edges' type (a list in the audit, an ``array('I')`` in a window),
    since slices of different types never compare equal.
    """
    bs, n = index.bs, len(q)
    if n - d < bs + 1:
        return 0
    first = _sibling(index, q, extra_keys, d)
    if first is None:
        return 0
    return layout_end_from(_like(index, q), d, first, d, bs)


def layout_end_from(q: Sequence[int], d: int, first: Node, depth: int, bs: int) -> int:
    """``layout_end`` against a known sibling path: ``q[d:]`` leaves the path that starts with
    node ``first`` at the path's absolute token ``depth`` (inside ``first``'s edge, or at its
    start); returns the index in ``q`` where the identical run ends, 0 without one.

    Any node with ``edge`` (its tokens), ``end`` (absolute depth after the edge) and
    insertion-ordered ``children`` will do: the trie's nodes, or the KV event mirror's blocks
    (``core/kvmirror.py``). ``q`` must hold tokens in the edges' sequence type (an
    ``array('I')`` for packed edges, a list for lists): slices of two types never compare
    equal."""
    if len(q) - d < bs + 1:
        return 0
    skip = depth - (first.end - len(first.edge))
    head = _head(first, skip + LAYOUT_SPAN + bs)[skip:]
    if len(head) < bs:
        return 0
    starts = q[d:d + LAYOUT_SPAN + 1]
    seen = set(head)  # a block can only start on a token the sibling has: most never do
    if seen.isdisjoint(starts):
        return 0
    mine = array("I", q[d:d + LAYOUT_SPAN + bs])
    hay = head.tobytes()
    for s in [s for s, t in enumerate(starts) if t in seen]:
        if s + bs > len(mine):
            break
        needle = mine[s:s + bs].tobytes()
        at = hay.find(needle)
        while at != -1 and at % 4:
            at = hay.find(needle, at + 1)
        if at == -1 or at // 4 > LAYOUT_SPAN:
            continue
        t = at // 4
        run = _run(q, d + s + bs, first, depth + t + bs)
        return d + s + bs + run
    return 0


def _like(index: PrefixIndex, q: Sequence[int]) -> Sequence[int]:
    """``q`` as the index's edges hold tokens (usually already so: no copy)."""
    if index.packed:
        return q if isinstance(q, array) and q.typecode == "I" else array("I", q)
    return q if type(q) is list else list(q)


def _common(a: Sequence[int], i: int, b: Sequence[int], j: int) -> int:
    """Length of the common run of ``a[i:]`` and ``b[j:]`` (same sequence type), doubling
    then halving."""
    m = min(len(a) - i, len(b) - j)
    lo, step = 0, 16
    while lo < m:
        hi = min(lo + step, m)
        if a[i + lo:i + hi] != b[j + lo:j + hi]:
            break
        lo, step = hi, step * 2
    else:
        return max(m, 0)
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if a[i + lo:i + mid] == b[j + lo:j + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _sibling(index: PrefixIndex, q: Sequence[int], extra_keys: Hashable, d: int
             ) -> Node | None:
    """The first node of the most recent earlier request that leaves ``q`` at ``d`` (the
    trie's most recent other branch at the divergence; its edge starts at depth ``d``)."""
    node = index.roots.get(extra_keys)
    if node is None:
        return None
    while node.end < d:
        child = node.children.get(q[node.end])
        if child is None or child.end > d:
            return None  # no node boundary at d: the request was not added here
        node = child
    mine = q[d] if d < len(q) else None
    for key in reversed(node.children):
        if key != mine:
            return node.children[key]
    return None


def _head(node: Node, want: int) -> array:
    """The first ``want`` tokens of the sibling path from ``node`` (most recent children)."""
    out = array("I")
    while True:
        out.extend(node.edge[:want - len(out)])
        if len(out) >= want or not node.children:
            return out
        node = next(reversed(node.children.values()))


def _run(q: Sequence[int], i: int, node: Node, depth: int) -> int:
    """The common run of ``q[i:]`` and the sibling path (from ``node``, most recent children)
    read from absolute ``depth`` on, compared edge by edge without copying the path."""
    while depth >= node.end:  # down to the edge that holds ``depth``
        if not node.children:
            return 0
        node = next(reversed(node.children.values()))
    run, n = 0, len(q)
    while i < n:
        edge = node.edge
        off = depth - (node.end - len(edge))
        k = _common(q, i, edge, off)
        run, i, depth = run + k, i + k, depth + k
        if depth < node.end or not node.children:
            return run  # a difference inside this edge, or the sibling ends
        node = next(reversed(node.children.values()))
    return run


# -- The event source: the same ledger from the engines' KV event streams ----------------------

#: The event ledger's counted parts and its shares, in the order a table prints them. The
#: counters keep the request ledger's identity (prompt = novel + layout + routing + eviction +
#: pool_reach, so rules written for it stay true) with ``pool_reach`` = achieved + tail +
#: unexplained, and count the tail on its own as well; the shares name the tail as a part.
EVENT_COUNTED: tuple[str, ...] = ("prompt", "novel", "layout", "routing", "eviction",
                                  names.LEDGER_TAIL, "pool_reach")
EVENT_SHARES: tuple[str, ...] = names.KV_LEDGER_SHARES


def event_shares(prompt: int, achieved: int, computed: dict[str, int], requests: int | None,
                 block_size: int) -> dict[str, int]:
    """The ledger of a span from the event source, in tokens, summing to ``prompt``.

    ``prompt`` and ``achieved`` (cached tokens, every tier) are the engines' own counters over
    the span; ``computed`` the event stream's computed tokens by part (whole device blocks).
    What is left, ``prompt - achieved - computed``, is the tokens no full block covers (the
    ``tail`` of each prompt, at most ``block_size - 1`` per request) and, past that bound or
    below 0, ``unexplained`` (lost messages, a stream that started mid-request, preemption)."""
    residual = prompt - achieved - sum(computed.get(p, 0) for p in names.KV_COMPUTED_PARTS)
    bound = residual if requests is None else (block_size - 1) * max(requests, 0)
    tail = min(max(residual, 0), max(bound, 0))
    out = {"achieved": achieved}
    out.update({p: computed.get(p, 0) for p in names.KV_COMPUTED_PARTS})
    out[names.LEDGER_TAIL] = tail
    out["unexplained"] = residual - tail
    return out


def event_counted(shares_: dict[str, int], prompt: int) -> dict[str, int]:
    """The counters of ``EVENT_COUNTED`` from ``event_shares``: pool_reach = achieved + tail +
    unexplained (what no computed full block explains), so prompt = novel + layout + routing +
    eviction + pool_reach as in the request ledger; the tail is also counted on its own."""
    out = {"prompt": prompt}
    out.update({p: shares_[p] for p in ("novel", "layout", "routing", "eviction",
                                         names.LEDGER_TAIL)})
    out["pool_reach"] = shares_["achieved"] + shares_[names.LEDGER_TAIL] + shares_["unexplained"]
    return out


def event_table(shares_: dict[str, int], prompt: int) -> list[str]:
    """The event ledger as text rows, as ``table`` prints the request ledger."""
    notes = {"achieved": "the engines' cached tokens (every tier)",
             "eviction": "this replica held it, then removed it",
             "routing": "another replica held it",
             "layout": "a prompt-layout fix would share it",
             "novel": "no replica held it",
             names.LEDGER_TAIL: "tails shorter than a block (never cached)",
             "unexplained": "lost messages, preemption, a stream started mid-way"}
    rows = [f"{'PART':<12} {'TOKENS':>12} {'SHARE':>7}", f"{'prompt':<12} {prompt:>12} "
            f"{(1.0 if prompt else 0.0):7.1%}"]
    for part in EVENT_SHARES:
        v = shares_[part]
        share = f"{v / prompt:7.1%}" if prompt else f"{'-':>7}"
        rows.append(f"{part:<12} {v:>12} {share}  {notes[part]}")
    return rows
