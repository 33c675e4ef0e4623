"""The layout search on packed words, and the tokens along a sibling path (pure).

``core.layout.layout_end_from`` (the request ledger's definition of a layout divergence) with the
query and the blocks' edges as 4-byte words: the same result (the tests compare both), without
an ``array`` per block along the sibling path. A path always follows the most recent child.
"""

from __future__ import annotations

from array import array

from prefixwatch.core.cache.layoutpart import LAYOUT_SPAN
from prefixwatch.core.kv.content import Block, common_words


def layout_end_packed(words: bytes, d: int, first: Block, depth: int, bs: int) -> int:
    """``layout_end_from(q, d, first, depth, bs)`` for ``q`` packed as ``words``."""
    n = len(words) >> 2
    if n - d < bs + 1:
        return 0
    skip = depth - (first.end - (len(first.raw) >> 2))
    head = _head_words(first, skip + LAYOUT_SPAN + bs)[4 * skip:]
    if len(head) < 4 * bs:
        return 0
    mine = array("I")
    mine.frombytes(words[4 * d:4 * (d + LAYOUT_SPAN + bs)])
    starts = mine[:LAYOUT_SPAN + 1]
    theirs = array("I")
    theirs.frombytes(head)
    seen = set(theirs)  # a block can only start on a token the sibling has: most never do
    if seen.isdisjoint(starts):
        return 0
    for s, t in enumerate(starts):  # the first start that finds its block wins: no list
        if t not in seen:
            continue
        if s + bs > len(mine):
            break
        needle = words[4 * (d + s):4 * (d + s + bs)]
        at = head.find(needle)
        while at != -1 and at % 4:
            at = head.find(needle, at + 1)
        if at == -1 or at // 4 > LAYOUT_SPAN:
            continue
        return d + s + bs + _run_words(words, d + s + bs, first, depth + at // 4 + bs)
    return 0


def _head_words(node: Block, want: int) -> bytes:
    """The first ``want`` tokens (as words) of the sibling path from ``node``."""
    out = b""
    while True:
        out += node.raw[:4 * want - len(out)]
        if len(out) >= 4 * want or node.last is None:
            return out
        node = node.last


def _run_words(words: bytes, i: int, node: Block, depth: int) -> int:
    """The common run (in tokens) of ``words`` from token ``i`` and the sibling path from
    ``node`` (most recent children) read from absolute ``depth`` on: the first block from
    its offset, then whole blocks compared a stretch of them at a time."""
    while depth >= node.end:  # down to the block that holds ``depth``
        if node.last is None:
            return 0
        node = node.last
    raw = node.raw
    off = 4 * depth - (4 * node.end - len(raw))
    k = common_words(words, 4 * i, raw[off:])
    if k < len(raw) - off or node.last is None:
        return k >> 2  # a difference inside this block, the words end, or the sibling ends
    at = 4 * i + k  # from here on, whole blocks of the path
    n = len(words)
    run = k
    while at < n and node.last is not None:
        stretch = []
        for _ in range(_STRETCH):
            node = node.last
            stretch.append(node.raw)
            if node.last is None:
                break
        joined = b"".join(stretch)
        k = common_words(words, at, joined)
        run, at = run + k, at + k
        if k < len(joined):
            break  # a difference in this stretch, or the words end
    return run >> 2


#: Blocks of the sibling path compared in one bytes comparison.
_STRETCH = 32


def path_tokens(node: Block | None, skip: int, want: int) -> list[int]:
    """Up to ``want`` tokens along the most recent path from ``node``, after ``skip``."""
    out: list[int] = []
    while node is not None and len(out) < want:
        out.extend(node.edge[skip:skip + want - len(out)])
        skip = 0
        node = node.last
    return out
