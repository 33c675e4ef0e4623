"""The content tree of one model's KV blocks, shared by its replicas' mirrors (pure).

Block hashes are seeded per engine process, so identity here is *content*: the chain of token
ids from the root plus the LoRA name and the block's extra keys (cache_salt, multimodal
hashes). A block's content id is Python's hash of (its parent's id, its extra key, its token
ids packed as 4-byte words): one tuple hash per block, with the chain from the root folded in
through the parent's id. A known chain is found without hashing where it follows the most
recent path (``known_prefix``: its words compared with the path's, which are those ids'
blocks). The tree is bounded: past the cap, the oldest blocks no replica holds are forgotten
first (counted by the caller).

A block keeps its most recent child (``last``), which is all a chain needs; only a block with
two or more children has a dict of them (``FleetContent.kids``), so a new block costs one small
object, not an object and a dict.
"""

from __future__ import annotations

import threading
from array import array
from collections import Counter
from collections.abc import Sequence
from operator import attrgetter
from typing import Any

import msgspec

from prefixwatch.core.vocab import exposition


class Block(msgspec.Struct, gc=False, eq=False):
    """One content block: its tokens and its place in the chain (a Struct the cyclic collector
    does not track: the tree's only cycles, a parent's ``last`` and its child's ``parent``,
    are broken when the tree is dropped, ``FleetContent.__del__``)."""

    cid: int
    parent: Block | None
    raw: bytes  # the block's token ids as 4-byte words (b"" for a root)
    end: int  # absolute token depth after this block
    #: The most recent child still known (None: none), which the layout search follows
    #: a block at a time.
    last: Block | None = None

    def __repr__(self) -> str:  # (not the Struct's, which would print the chain around it)
        return f"Block(cid={self.cid}, end={self.end})"

    @property
    def edge(self) -> array:
        """The tokens as ``array('I')``, made when asked (the layout search, a divergence):
        the raw words are what identity hashes, and far cheaper to keep."""
        out = array("I")
        out.frombytes(self.raw)
        return out


class FleetContent:
    """The content tree of one model and which of its replicas hold each block (one lock)."""

    def __init__(self, model: str, max_blocks: int = exposition.KV_MAX_CONTENT_BLOCKS) -> None:
        self.model = model
        #: The content ids of placeholder roots: chains whose first parent was never seen,
        #: so their token positions count from an unknown depth.
        self.placeholder_roots: set[int] = set()
        self.max_blocks = max_blocks
        self.lock = threading.Lock()
        self.blocks: dict[int, Block] = {}  # insertion order: the oldest first
        self.roots: dict[Any, Block] = {}
        #: The children (cid -> block, the oldest first) of each block that has two or more
        #: known ones; a block with one has it as its ``last`` only.
        self.kids: dict[Block, dict[int, Block]] = {}
        #: Per replica id: content block -> its resident copies there, every medium; and the
        #: content blocks it removed a copy of (forgotten blocks leave both).
        self.held: list[Counter[Block]] = []
        self.evicted: list[set[Block]] = []
        #: Whether any block was made with an extra key (then ``known_prefix`` is not used).
        self.keyed = False

    def __del__(self) -> None:
        # Every ``last`` names a block of ``blocks`` (forgetting a block unlinks it): cut
        # each, and its parent's, and the tree is acyclic, freed as soon as it is dropped.
        for node in self.blocks.values():
            node.last = None
            if node.parent is not None:
                node.parent.last = None

    def root(self, key: Any) -> Block:
        node = self.roots.get(key)
        if node is None:
            node = self.roots[key] = Block(hash(("root", key)), None, b"", 0)
        return node

    def new_replica(self) -> tuple[int, Counter[Block], set[Block]]:
        """A replica id, its holdings (content block -> copies) and what it evicted."""
        held: Counter[Block] = Counter()
        evicted: set[Block] = set()
        self.held.append(held)
        self.evicted.append(evicted)
        return len(self.held) - 1, held, evicted

    def others(self, rid: int) -> list[Counter[Block]]:
        """The non-empty holdings of every replica but ``rid``."""
        return [h for i, h in enumerate(self.held) if h and i != rid]

    def extend(self, parent: Block, cids: Sequence[int], parts: Sequence[bytes],
               nodes: list[Block | None], start: int) -> Block | None:
        """Make the blocks of a chain that are not known yet (None in ``nodes``, from
        ``start`` on), each under the block before it (``parent`` before the first); returns
        the most recent other child of the first new block's parent (None: none)."""
        blocks = self.blocks
        prev = nodes[start - 1] if start else parent
        assert prev is not None
        sibling = prev.last
        for i in range(start, len(nodes)):
            node = nodes[i]
            if node is None:
                part = parts[i]
                node = Block(cids[i], prev, part, prev.end + (len(part) >> 2))
                if prev.last is not None:
                    self._branch(prev, node)
                prev.last = nodes[i] = blocks[node.cid] = node
            prev = node
        return sibling

    def known_prefix(self, node: Block, words: bytes, n: int, width: int) -> list[Block]:
        """The known blocks that the first of ``n`` blocks of ``words`` (``width`` bytes
        each, under ``node``, no extra keys) are, up to the first one not known. Along the
        most recent path a stretch of blocks is compared at once, with no hash (a ``last`` is
        a known child: the content id its words would hash to is its own); a block off
        that path is looked up by its content id, and the path from it followed again."""
        out: list[Block] = []
        if self.keyed:
            return out
        blocks = self.blocks
        at = 0
        while len(out) < n:
            nxt = node.last
            if nxt is None or len(nxt.raw) != width or not words.startswith(nxt.raw, at):
                found = blocks.get(content_id(node.cid, None, words[at:at + width]))
                if found is None:
                    return out
                out.append(found)
                node, at = found, at + width
                continue
            stretch = []
            for _ in range(min(_FOLLOW, n - len(out))):
                stretch.append(nxt)
                nxt = nxt.last
                if nxt is None:
                    break
            raws = list(map(_raw, stretch))
            if set(map(len, raws)) != {width}:
                stretch = stretch[:1]  # blocks of another size further on: one at a time
                raws = raws[:1]
            joined = b"".join(raws)
            if words.startswith(joined, at):
                out += stretch
                at += len(joined)
            else:  # (its first block is the path's: checked above)
                k = common_words(words, at, joined) // width
                out += stretch[:k]
                at += k * width
            node = out[-1]
        return out

    def _branch(self, parent: Block, node: Block) -> None:
        """Record ``node`` as one more child of ``parent``, which has one already."""
        kids = self.kids.get(parent)
        if kids is None:
            last = parent.last
            assert last is not None
            kids = self.kids[parent] = {last.cid: last}
        kids[node.cid] = node

    def _unlink(self, parent: Block, node: Block) -> None:
        """``node`` is forgotten: no longer a child of ``parent``."""
        kids = self.kids.get(parent)
        if kids is None:
            if parent.last is node:
                parent.last = None
            return
        kids.pop(node.cid, None)
        if parent.last is node:
            parent.last = next(reversed(kids.values()), None)
        if len(kids) < 2:
            del self.kids[parent]

    def child(self, parent: Block, cid: int, part: bytes) -> Block:
        """The block ``cid`` (made under ``parent`` when not known)."""
        node = self.blocks.get(cid)
        if node is None:
            node = self.blocks[cid] = Block(cid, parent, part, parent.end + (len(part) >> 2))
            if parent.last is not None:
                self._branch(parent, node)
            parent.last = node
        return node

    def trim(self) -> int:
        """Forget the oldest blocks no replica holds until under the cap; returns how many."""
        blocks = self.blocks
        held = [h for h in self.held if h]
        gone: list[Block] = []
        budget = len(blocks)  # each block is looked at once at most
        while len(blocks) > self.max_blocks and budget > 0:
            budget -= 1
            cid = next(iter(blocks))
            node = blocks.pop(cid)
            if any(node in h for h in held):
                blocks[cid] = node  # held: to the back of the line
                continue
            if node.parent is not None:
                self._unlink(node.parent, node)
            gone.append(node)
        for evicted in self.evicted:
            evicted.difference_update(gone)
        return len(gone)

    def prune_evicted(self, evicted: set[Block]) -> None:
        """Drop the blocks no longer in the tree from one replica's evicted set (a block
        forgotten, then held again through its engine hash and removed)."""
        blocks = self.blocks
        evicted.intersection_update([n for n in evicted if blocks.get(n.cid) is n])


#: Blocks of the most recent path compared in one bytes comparison by ``known_prefix``.
_FOLLOW = 32
_raw = attrgetter("raw")


def pack(tokens: list[int]) -> bytes:
    """Token ids as 4-byte words (what identity hashes and the layout search compares)."""
    words = array("I")
    words.fromlist(tokens)  # faster than array("I", tokens), which iterates generically
    return words.tobytes()


def split_words(words: bytes, width: int) -> list[bytes]:
    """``words`` cut into blocks of ``width`` bytes."""
    return [words[o:o + width] for o in range(0, len(words), width)]


def common_words(words: bytes, at: int, raw: bytes) -> int:
    """The bytes of whole 4-byte words ``words[at:]`` and ``raw`` share from their starts
    (one comparison when they agree; else a bisection of the words, each step one
    comparison in C)."""
    m = min(len(words) - at, len(raw))
    if m <= 0:
        return 0
    if words[at:at + m] == raw[:m]:
        return m - m % 4
    lo, hi = 0, m >> 2  # the first lo words agree, the first hi do not
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if words[at:at + 4 * mid] == raw[:4 * mid]:
            lo = mid
        else:
            hi = mid
    return 4 * lo


def content_id(parent: int, key: Any, part: bytes) -> int:
    """The content id of one block: under content id ``parent``, with extra key ``key``
    (None: none), its token ids packed as ``part``."""
    return hash((parent, key, part))


def content_ids(parent: int, parts: Sequence[bytes], keys: Sequence[Any] | None) -> list[int]:
    """The content id of each block of a chain that starts under content id ``parent``
    (``content_id``'s hash, inline: a device store's blocks are the hot path)."""
    out: list[int] = []
    keep = out.append
    if keys is None:
        for part in parts:
            parent = hash((parent, None, part))
            keep(parent)
    else:
        for part, key in zip(parts, keys, strict=True):
            parent = hash((parent, key, part))
            keep(parent)
    return out


def block_keys(extra: list[Any] | None, n: int) -> list[Any] | None:
    """The identity key of each of ``n`` blocks from an event's extra keys (None: none)."""
    if not extra or extra.count(None) == len(extra):
        return None
    keys = [None if x is None else freeze(x) for x in extra[:n]]
    keys.extend([None] * (n - len(keys)))
    return keys


def freeze(value: Any) -> Any:
    """An extra key as a hashable value (msgpack gives lists)."""
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), freeze(v)) for k, v in value.items()))
    return value
