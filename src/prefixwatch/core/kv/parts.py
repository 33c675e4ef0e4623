"""Why each device block a replica stored had to be computed, or which tier supplied it (pure).

Every device block a replica stores and no lower tier of it supplied was computed; it is
classified once, when stored, by why (in tokens, ``block_size`` each):

- ``eviction``: this replica held that content before and removed it;
- ``routing``: otherwise, another replica of the model holds it now (any medium);
- ``layout``: otherwise, the same text as an earlier chain after a short divergence
  (``core.layout.layout_end_from``, the request ledger's own definition, here on the packed
  words: ``layoutsearch.layout_end_packed``);
- ``novel``: the rest.

A device block whose hash a lower tier of the same replica holds is ``loaded`` from that tier,
not computed. Each part is decided for a whole event at once (set membership over its blocks).
Where a new chain leaves the closest known chain is kept as a token position (a timestamp at
token 8 reads 8), with the tokens on both sides so a tokenizer can say what varies there.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from typing import Any

from prefixwatch.core.kv import layoutsearch
from prefixwatch.core.kv.content import Block
from prefixwatch.core.kv.counts import Divergence, Histogram
from prefixwatch.core.vocab import exposition

#: Why a device block had to be computed (prefixwatch_kv_computed_tokens_total{part}).
COMPUTED_PARTS: tuple[str, ...] = exposition.KV_COMPUTED_PARTS
#: The tokens around a divergence kept for a tokenizer (each side).
DIVERGENCE_CONTEXT = 24
#: Divergences waiting for a tokenizer, at most.
MAX_PENDING_DIVERGENCES = 256

def _made_before(chain: Sequence[Block | None], known: int) -> Sequence[Block | None]:
    """The blocks of a chain before ``known``: those a replica may hold or have removed (the
    rest were made by the store itself)."""
    return chain if known >= len(chain) else chain[:known]


def _nones(chain: Sequence[Block | None]) -> int:
    """How many of a chain's entries are None: its blocks are always true, so ``all`` answers
    the common case (none) at once, and a count by truth (``filter``) is about twice as fast
    as ``chain.count(None)``'s comparisons."""
    return 0 if all(chain) else len(chain) - len(list(filter(None, chain)))


class ComputedParts:
    """One replica's computed tokens by part, loaded tokens by tier, and its divergences."""

    def __init__(self) -> None:
        self.computed = dict.fromkeys(COMPUTED_PARTS, 0)
        self.loaded: dict[str, int] = {}
        self.divergence = Histogram(exposition.DIVERGENCE_BUCKETS)
        self.pending: deque[Divergence] = deque(maxlen=MAX_PENDING_DIVERGENCES)
        #: Divergences dropped unnamed from a full ``pending`` (the oldest first).
        self.pending_dropped = 0
        #: The last device store's blocks this replica had evicted, (position, content) in
        #: order, and which tier supplied each of its blocks (None: none): the what-if's.
        self.reused: list[tuple[int, Block]] | None = None
        self.source: list[str | None] | None = None

    def claim(self, nodes: Sequence[Block | None], hashes: Sequence[Any],
              lower: list[tuple[str, dict[Any, Any]]], evicted: set[Block],
              others: list[Counter[Block]], bs: int, known: int) -> Sequence[Block | None]:
        """Count the loaded, eviction and routing blocks of one device store; returns its
        chain with those (and blocks of unknown content, novel) as None: the rest is layout
        or novel (``layout``). (``nodes`` itself when none is claimed: never changed here.)
        The blocks from ``known`` on were made by this store: no replica holds them or
        removed them, so only those before are looked for in what replicas hold."""
        chain = nodes
        loaded_here = 0
        source: list[str | None] | None = None
        self.reused = None
        self.source = None
        for medium, per in lower:  # the first lower tier holding a hash supplied it
            if per.keys().isdisjoint(hashes):
                continue
            if source is None:
                source = [None] * len(chain)
            source = [s if s is not None or h not in per else medium
                      for s, h in zip(source, hashes, strict=True)]
        if source is not None:
            for medium, _per in lower:
                k = source.count(medium)
                if k:
                    self.loaded[medium] = self.loaded.get(medium, 0) + k * bs
                    loaded_here += k
            chain = [None if s is not None else node
                     for node, s in zip(chain, source, strict=True)]
            self.source = source
        claimed = _nones(chain)
        computed = self.computed
        computed["novel"] += (claimed - loaded_here) * bs  # content not known: novel
        old = _made_before(chain, known)
        if not evicted.isdisjoint(old):
            self.reused = [(i, node) for i, node in enumerate(old) if node in evicted]
            chain = [None if node in evicted else node for node in chain]
            now = _nones(chain)
            computed["eviction"] += (now - claimed) * bs
            claimed = now
            old = _made_before(chain, known)
        for held in others:
            if not held.keys().isdisjoint(old):
                chain = [None if node in held else node for node in chain]
                now = _nones(chain)
                computed["routing"] += (now - claimed) * bs
                claimed = now
                old = _made_before(chain, known)
        return chain

    def layout(self, chain: Sequence[Block | None], created_at: int, toks: Sequence[int],
               words: bytes, bs: int, sibling: Block | None) -> None:
        """Layout or novel for the computed blocks no other part claimed (``sibling``: the
        most recent other child of the first new block's parent, what ``extend`` returned)."""
        computed = self.computed
        layout_until = -1  # blocks of the chain before this index are layout
        if created_at >= 0:
            new = chain[created_at]  # None: loaded, whatever its content
            start = (self._divergence(new, sibling, created_at, toks, bs) if new is not None
                     else None)
            if start is not None:
                first, j, depth = start
                end = layoutsearch.layout_end_packed(words[created_at * 4 * bs:], j, first, depth,
                                                 bs)
                if end:
                    layout_until = created_at + end // bs
        kept = len(chain) - _nones(chain)
        layout = 0
        if layout_until > created_at >= 0:
            span = chain[created_at:layout_until]
            layout = len(span) - _nones(span)
        computed["layout"] += layout * bs
        computed["novel"] += (kept - layout) * bs

    def _divergence(self, new: Block, sibling: Block | None, at: int, toks: Sequence[int],
                    bs: int) -> tuple[Block, int, int] | None:
        """Observe where the chain that creates ``new`` leaves the closest known chain (at
        ``sibling``, its parent's most recent other child); returns (the sibling's first
        block, the offset in ``new``, the absolute depth) for layout."""
        parent = new.parent
        assert parent is not None
        if sibling is None:
            if parent.parent is not None:  # extends a known chain at its end
                self.divergence.observe(parent.end)
            return None
        mine, theirs = new.edge, sibling.edge
        j = 0
        while j < bs and mine[j] == theirs[j]:
            j += 1
        position = parent.end + j
        self.divergence.observe(position)
        lo = at * bs + j
        root = parent
        while root.parent is not None:  # a block per 16 tokens, once per divergence
            root = root.parent
        if len(self.pending) == MAX_PENDING_DIVERGENCES:
            self.pending_dropped += 1
        self.pending.append(Divergence(
            position, _tokens_before(new, j), list(toks[lo:lo + DIVERGENCE_CONTEXT]),
            layoutsearch.path_tokens(sibling, j, DIVERGENCE_CONTEXT),
            parent.end + len(toks) - at * bs, root.cid))
        return sibling, j, parent.end + j


def _tokens_before(new: Block, j: int) -> list[int]:
    """The DIVERGENCE_CONTEXT tokens before the ``j``-th of ``new``: its own first ``j`` and
    its ancestors' (a value that varies, such as a timestamp, often starts a block or two
    before the token where two prompts part, in blocks an event does not carry again)."""
    tail = list(new.edge[:j])
    node = new.parent
    while len(tail) < DIVERGENCE_CONTEXT and node is not None and node.raw:
        tail[:0] = node.edge
        node = node.parent
    return tail[-DIVERGENCE_CONTEXT:]
