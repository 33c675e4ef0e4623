"""THE prefix index of request logs: an exact compressed trie (radix tree) over token ids.

Used by the audit, the exporter's request view (a sliding window), the incident report and
the ledger. For every request it answers, against all earlier requests of the same extra keys
(LoRA adapter, cache_salt, multimodal hashes; one root each, so chains never meet):

- the exact longest common prefix (LCP) in tokens, hence vLLM's cacheable tokens: an earlier
  request's first k full blocks are all cached, so an LCP of at least k * B tokens is k block
  hits, within the first n - 1 tokens (``core.blockcache.cached_tokens_for``);
- the divergence, exact to the token: where both requests have a token and they differ.

Each edge holds its own copy of a run of tokens (a packed ``array('I')``, 4 bytes a token, in
the audit and a window; a list when the index is built from lists), made once when the edge
is created; a node's children are keyed by their first token, in insertion order. A look-up
walks the edges and compares whole slices at C speed (``a[i:j] == b[k:l]``), galloping then
halving to the first mismatch inside an edge, so the matched part of a prompt costs a few
slice copies, not Python work per token or per block, and nothing is hashed.

In a sliding window (``max_requests`` / ``max_blocks``, oldest out first) each node counts the
requests through it; dropping a request decrements its path, deletes the nodes that reach 0
and merges a node left with one child into it, so the trie is always the compressed trie of
the window's requests and memory is bounded on an endless log.

Why the simulator does not use it: its block pool (``core.blockcache``) is vLLM's cache, where
a block in the middle of a prompt can be evicted while later ones stay cached, so it keys
blocks one by one (chained 64-bit block ids). The index is the log's view: nothing is
evicted, only whole requests leave a window, so a radix tree is exact and much cheaper.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Hashable, MutableSequence, Sequence
from dataclasses import dataclass

from prefixwatch.core.cache.cacherule import cached_tokens_for

#: Tokens of context kept after a divergence (each side), and shown before it.
CONTEXT_TOKENS = 12
#: Tokens kept before a divergence: enough to read back to where the value that varies
#: there starts (a timestamp with its fraction is about 14 tokens).
BEFORE_TOKENS = 24
_PROBE = 16  # tokens compared first, before a whole long edge


@dataclass
class Divergence:
    position: int
    mine: tuple[int, ...]  # this request's tokens around the position
    theirs: tuple[int, ...]  # the same start, then an earlier request's tokens from position
    offset: int  # index of the position inside `mine`


@dataclass
class RequestResult:
    prompt_tokens: int
    cacheable_tokens: int
    divergence: Divergence | None
    simulated_cached_tokens: int | None = None


class Node:
    """One edge of the trie: its tokens, the depth where it ends, its children by first token."""

    __slots__ = ("children", "count", "edge", "end", "parent")

    def __init__(self, edge: MutableSequence[int], end: int, parent: Node | None) -> None:
        self.edge = edge
        self.end = end  # tokens from the root to the end of this edge
        self.parent = parent
        self.children: dict[int, Node] = {}
        self.count = 0  # requests through or ending here (sliding windows only)


@dataclass(slots=True)
class Entry:
    """One request in a sliding window: where it ends in the trie and what the view reports."""

    at: float
    extra_keys: Hashable
    node: Node  # the node where this request ends (its path is the way up to the root)
    prompt_tokens: int
    cacheable_tokens: int
    long: bool
    reach: int  # the longest common prefix with the window's earlier requests, in tokens
    kind: str | None = None
    #: The token where the value that varies at ``reach`` starts (core/cache/whatvaries.py).
    culprit_at: int | None = None


_Stop = tuple[Node, Node | None, int]  # last whole node matched, the edge left inside, at


class PrefixIndex:
    """Every request given (or a sliding window of them) in one radix tree per extra keys.

    ``add`` is the audit's pass (match, then insert); ``add_timed`` / ``drop_oldest`` the
    window's; ``reach`` / ``insert`` the ledger's (a look-up without inserting, and an insert).
    ``packed``: edges and queries are ``array('I')`` (4 bytes a token, slices compared with
    one memcmp) rather than lists of ints; the default is packed for a window, lists
    otherwise. The audit packs too: the ids it reads from a log are already arrays.
    """

    def __init__(self, block_size: int, max_requests: int | None = None,
                 max_blocks: int | None = None, packed: bool | None = None) -> None:
        if block_size < 1 or (max_requests is not None and max_requests < 1) or (
                max_blocks is not None and max_blocks < 1):
            raise ValueError("block size and window bounds must be at least 1")
        self.bs = block_size
        self.max_requests = max_requests
        self.max_blocks = max_blocks
        self.sliding = max_requests is not None or max_blocks is not None
        self.packed = self.sliding if packed is None else packed
        self.roots: dict[Hashable, Node] = {}
        self.window: deque[Entry] = deque()
        #: Distinct full KV blocks held: each distinct prefix of k * block_size tokens once.
        self.blocks = 0

    # -- the public passes ---------------------------------------------------------------------

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None) -> RequestResult:
        """Match a request against the earlier ones, then add it (the audit's pass)."""
        q = tokens if tokens.__class__ is list and not self.packed else self._query(tokens)
        lcp, divergence, end = self._add(q, extra_keys, True)
        n = len(q)
        if self.sliding:
            self._enter(q, extra_keys, 0.0, lcp, end)
        return RequestResult(n, cached_tokens_for(n, lcp // self.bs, self.bs), divergence)

    def add_timed(self, tokens: Sequence[int], extra_keys: Hashable = None, at: float = 0.0
                  ) -> tuple[Entry, Divergence | None]:
        """The sliding window's add: the request's window entry and its divergence.

        Raises OverflowError (nothing changed) for a token id that does not fit in 32 bits
        when the index is a window."""
        q = self._query(tokens)
        lcp, divergence, end = self._add(q, extra_keys, True)
        return self._enter(q, extra_keys, at, lcp, end), divergence

    def insert(self, tokens: Sequence[int], extra_keys: Hashable = None, at: float = 0.0
               ) -> Entry:
        """Add a request without looking for its divergence; its entry has its ``reach``."""
        q = self._query(tokens)
        lcp, _, end = self._add(q, extra_keys, False)
        return self._enter(q, extra_keys, at, lcp, end)

    def reach(self, tokens: Sequence[int], extra_keys: Hashable = None) -> int:
        """The longest common prefix, in tokens, of ``tokens`` with any request held (of the
        same extra keys), without adding it."""
        root = self.roots.get(extra_keys)
        if root is None:
            return 0
        q = self._query(tokens)
        node, _, j = self._walk(root, q)
        return node.end + j

    def cacheable(self, tokens: Sequence[int], extra_keys: Hashable = None) -> int:
        """vLLM's cached tokens for ``tokens`` if it came next (without adding it)."""
        return cached_tokens_for(len(tokens), self.reach(tokens, extra_keys) // self.bs,
                                 self.bs)

    # -- matching ------------------------------------------------------------------------------

    def _query(self, tokens: Sequence[int]) -> MutableSequence[int]:
        """The request as the edges' type: slices of the same type compare at C speed."""
        if self.packed:
            if isinstance(tokens, array) and tokens.typecode == "I":
                return tokens
            return array("I", tokens)  # raises OverflowError beyond 32 bits
        return tokens if type(tokens) is list else list(tokens)

    @staticmethod
    def _walk(root: Node, q: Sequence[int]) -> _Stop:
        """Follow ``q`` down from ``root``: the last node whose whole edge matched, the child
        whose edge the walk stopped in (None at a node boundary) and the tokens of it matched.

        An edge is compared whole (one slice of the query); a long one first on its first
        _PROBE tokens, where prompts that differ near an edge's start differ."""
        node, d, n = root, 0, len(q)
        while d < n:
            child = node.children.get(q[d])
            if child is None:
                break
            edge = child.edge
            size = len(edge)
            if d + size > n:  # the query ends inside this edge
                return node, child, _shared(edge, q, d, n - d)
            probed = _PROBE if size > _PROBE else 0
            if probed and edge[:_PROBE] != q[d:d + _PROBE]:
                return node, child, _first_difference(edge, q, d, 0, _PROBE)
            if edge != q[d:d + size]:
                return node, child, _first_difference(edge, q, d, probed, size)
            node, d = child, d + size
        return node, None, 0

    def _add(self, q: MutableSequence[int], extra_keys: Hashable, diverge: bool
             ) -> tuple[int, Divergence | None, Node]:
        """Match ``q`` then insert what is new; (LCP, divergence, the node where it ends)."""
        root = self.roots.get(extra_keys)
        if root is None:
            root = self.roots[extra_keys] = Node(q[:0], 0, None)
        node, child, j = self._walk(root, q)
        lcp, n = node.end + j, len(q)
        divergence = _divergence(q, node, child, j) if diverge and lcp < n else None
        if child is not None and (lcp < n or self.sliding):
            node = _split(node, child, j)
        if lcp < n:
            leaf = Node(q[lcp:], n, node)
            node.children[q[lcp]] = leaf
            self.blocks += n // self.bs - lcp // self.bs
            node = leaf
        return lcp, divergence, node

    # -- the sliding window --------------------------------------------------------------------

    def _enter(self, q: Sequence[int], extra_keys: Hashable, at: float, lcp: int, end: Node
               ) -> Entry:
        """Count the request along its path, then keep the window within its bounds."""
        n = len(q)
        entry = Entry(at, extra_keys, end, n, cached_tokens_for(n, lcp // self.bs, self.bs),
                      n > self.bs, lcp)
        if not self.sliding:
            return entry
        node: Node | None = end
        while node is not None:
            node.count += 1
            node = node.parent
        self.window.append(entry)
        while (self.max_requests is not None and len(self.window) > self.max_requests) or (
                self.max_blocks is not None and self.blocks > self.max_blocks
                and len(self.window) > 1):
            self.drop_oldest()
        return entry

    def drop_oldest(self) -> Entry:
        """Take the oldest request out of the window, and the tokens only it held."""
        entry = self.window.popleft()
        bs = self.bs
        node = entry.node
        while (parent := node.parent) is not None:
            node.count -= 1
            if node.count == 0:
                del parent.children[node.edge[0]]
                self.blocks -= node.end // bs - (node.end - len(node.edge)) // bs
            elif len(node.children) == 1:
                only = next(iter(node.children.values()))
                if only.count == node.count:  # no request ends here any more: one edge
                    only.edge = node.edge + only.edge
                    only.parent = parent
                    parent.children[node.edge[0]] = only
            node = parent
        node.count -= 1
        if node.count == 0:
            del self.roots[entry.extra_keys]
        return entry


def _shared(a: Sequence[int], b: Sequence[int], d: int, m: int) -> int:
    """How many of the first ``m`` tokens of edge ``a`` equal ``b`` from ``d``."""
    if a[:m] == b[d:d + m]:
        return m
    return _first_difference(a, b, d, 0, m)


def _first_difference(a: Sequence[int], b: Sequence[int], d: int, lo: int, hi: int) -> int:
    """The first ``i`` in [lo, hi) where ``a[i] != b[d + i]``, given that ``a[:lo]`` matches
    and one differs before ``hi``: halving, one C-level slice comparison a step."""
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if a[lo:mid] == b[d + lo:d + mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _split(parent: Node, child: Node, j: int) -> Node:
    """Cut ``child``'s edge after ``j`` tokens: the new node in between, holding the first part."""
    edge = child.edge
    rest = edge[j:]
    del edge[j:]  # the first part keeps the edge's storage: only the rest is copied
    mid = Node(edge, child.end - len(rest), parent)
    mid.count = child.count
    mid.children[rest[0]] = child
    child.edge = rest
    child.parent = mid
    parent.children[edge[0]] = mid
    return mid


def _continuation(node: Node, j: int) -> tuple[int, ...]:
    """CONTEXT_TOKENS tokens of an earlier request from ``j`` tokens into ``node``'s edge,
    going down through the most recent children where an edge ends."""
    out = list(node.edge[j:j + CONTEXT_TOKENS])
    while len(out) < CONTEXT_TOKENS and node.children:
        node = next(reversed(node.children.values()))
        out.extend(node.edge[:CONTEXT_TOKENS - len(out)])
    return tuple(out)


def _divergence(q: Sequence[int], node: Node, child: Node | None, j: int) -> Divergence | None:
    """Where ``q`` leaves every earlier request, if an earlier one has a different token
    there: inside ``child``'s edge, or at ``node``'s end against its most recent child."""
    position = node.end + j
    if child is None:
        if not node.children:
            return None  # earlier requests ended here: this one extends them, nothing differs
        child = next(reversed(node.children.values()))
    lo = max(0, position - BEFORE_TOKENS)
    mine = tuple(q[lo:position + CONTEXT_TOKENS])
    theirs = mine[:position - lo] + _continuation(child, j)
    return Divergence(position, mine, theirs, position - lo)
