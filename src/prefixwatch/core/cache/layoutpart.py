"""The layout part's one definition: where the identical run after a short varying span ends.

A prompt that leaves its closest earlier sibling at token d for at most ``LAYOUT_SPAN`` tokens,
after which both continue identically for at least a full block, would share that run with a
prompt-layout fix (a date, an id moved out of the prefix). The request ledger searches its
prefix trie with it; the KV event mirror (``core/kv/mirror.py``) the same way on packed words.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence

from prefixwatch.core.cache.prefixindex import Node, PrefixIndex

#: The longest varying span (tokens) a layout fix is credited for: a date, an id, a name.
LAYOUT_SPAN = 64


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
    insertion-ordered ``children`` (the last the most recent) will do: the trie's nodes, or a
    view of the KV event mirror's blocks (whose own search, ``core/kv/layoutsearch.py``, is checked
    against this one). ``q`` must hold tokens in the edges' sequence type (an ``array('I')``
    for packed edges, a list for lists): slices of two types never compare equal."""
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
