"""The one prefix index: vLLM's chained full-block identity and its longest-prefix match.

A block's identity is a 64-bit number chained over the prompt, as vLLM chains block hashes:
``id(k) = id(k - 1) + hash(block k) * W[k]  (mod 2**64)``, starting from a root id that
stands for the request's extra keys (LoRA adapter, cache_salt, multimodal hashes), so two
chains with different extra keys never meet. ``hash(block)`` is CPython's 64-bit tuple hash
of the block's token ids (deterministic for ints, no PYTHONHASHSEED) and ``W`` are fixed
random odd 64-bit weights; the whole chain of a prompt is one numpy cumulative sum, so the
cost is one C-level pass over the tokens instead of a Python loop per block. Two different
prefixes share an id with probability about 2**-64 per pair: no false match in practice.

``PrefixIndex`` holds every full block of the requests it was given (the audit) or of the
last ``max_requests`` of them, within ``max_blocks`` blocks (the exporter's sliding window,
reference-counted). Because it holds whole chains, the set of ids is prefix-closed and the
longest cached prefix is a binary search (``longest_prefix``). The simulator's block pool
uses the same ids (``block_ids``, ``child_id``) for its own cached blocks.

The divergence is exact to the token: the first block that does not match is compared with
the RECENT_SIBLINGS most recent earlier blocks that follow the same prefix (``closest_sibling``).
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from itertools import islice

import numpy as np

RECENT_SIBLINGS = 32
CONTEXT_TOKENS = 12
MASK = (1 << 64) - 1
_WEIGHT_CHUNK = 4096
_SEED = 0x5EED_B10C
_weights = np.zeros(0, dtype=np.uint64)
_weights_lock = threading.Lock()

Block = tuple[int, ...]


def _weights_for(n: int) -> np.ndarray:
    """The first ``n`` chain weights; the same on every run (grown in seeded chunks)."""
    global _weights
    w = _weights
    if len(w) < n:
        with _weights_lock:
            w = _weights
            chunks = [w]
            for c in range(len(w) // _WEIGHT_CHUNK, -(-n // _WEIGHT_CHUNK)):
                rng = np.random.default_rng([_SEED, c])
                chunk = rng.integers(0, 2**64, size=_WEIGHT_CHUNK, dtype=np.uint64)
                chunks.append(chunk | np.uint64(1))
            w = _weights = np.concatenate(chunks)
    return w[:n]


def root_id(extra_keys: Hashable) -> int:
    """The id a chain starts from: the extra keys (None for a plain request)."""
    return hash(("prefixwatch-root", extra_keys)) & MASK


def split_blocks(tokens: Sequence[int], block_size: int) -> list[Block]:
    """The full blocks of ``tokens``, as tuples (one C-level pass)."""
    full = len(tokens) - len(tokens) % block_size
    return list(zip(*[iter(tokens[:full])] * block_size, strict=True))


def block_ids(tokens: Sequence[int], block_size: int, root: int) -> list[int]:
    """The chained id of every full block of ``tokens`` (a prompt, from its start)."""
    n = len(tokens) // block_size
    if n == 0:
        return []
    # zip hands out one reused tuple per block when nothing keeps it: no allocation.
    blocks = zip(*[iter(tokens)] * block_size, strict=False)
    h = np.fromiter(map(hash, blocks), dtype=np.int64, count=n).view(np.uint64)
    h *= _weights_for(n)
    np.cumsum(h, out=h)
    h += np.uint64(root)
    return h.tolist()


def child_id(parent: int, depth: int, block: Block) -> int:
    """The id of ``block`` at 0-based position ``depth`` after ``parent``: one chain step,
    equal to what ``block_ids`` computes for the whole prompt."""
    weight = int(_weights_for(depth + 1)[depth])
    return (parent + (hash(block) & MASK) * weight) & MASK


def cached_tokens_for(num_tokens: int, hit_blocks: int, block_size: int) -> int:
    """Tokens served from cache: whole hit blocks, never past ``num_tokens - 1``."""
    max_blocks = max(num_tokens - 1, 0) // block_size
    return min(hit_blocks, max_blocks) * block_size


def longest_prefix(ids: Sequence[int], held: Callable[[int], bool] | dict | set,
                   limit: int | None = None) -> int:
    """How many leading ids are held, when what is held is prefix-closed (binary search)."""
    contains = held.__contains__ if isinstance(held, (dict, set)) else held
    lo, hi = 0, len(ids) if limit is None else min(limit, len(ids))
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if contains(ids[mid - 1]):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass
class Divergence:
    position: int
    mine: tuple[int, ...]  # this request's tokens around the position
    theirs: tuple[int, ...]  # the closest earlier request's tokens from the same start
    offset: int  # index of the position inside `mine`


@dataclass
class RequestResult:
    prompt_tokens: int
    cacheable_tokens: int
    divergence: Divergence | None
    simulated_cached_tokens: int | None = None


@dataclass
class Entry:
    """One request in a sliding window: what it holds and what the view reports of it."""

    at: float
    extra_keys: Hashable
    ids: list[int]  # its full blocks
    tail: tuple[int, Block] | None  # (parent id, partial last block)
    prompt_tokens: int
    cacheable_tokens: int
    long: bool
    kind: str | None = None


class PrefixIndex:
    """Every full block of the requests given (or of a sliding window of them), by chained id.

    ``nodes[id]`` is the block's first child: the block (or partial tail) that followed it in
    the request that created it, or None. Where a second child appears, ``branches[id]``
    lists all children in the order they appeared (a root's children are always there). The
    partial tail of a request is never a cache hit, but later requests measure their
    divergence against it, so it is kept as a child too. Only new blocks cost a Python
    object (their token tuple); the look-up itself is a binary search on the chained ids.

    With ``max_requests`` / ``max_blocks``, requests leave oldest first and each block is
    reference-counted, so memory stays bounded however long the log runs.
    """

    def __init__(self, block_size: int, max_requests: int | None = None,
                 max_blocks: int | None = None) -> None:
        if block_size < 1 or (max_requests is not None and max_requests < 1) or (
                max_blocks is not None and max_blocks < 1):
            raise ValueError("block size and window bounds must be at least 1")
        self.bs = block_size
        self.max_requests = max_requests
        self.max_blocks = max_blocks
        self.nodes: dict[int, Block | None] = {}
        self.branches: dict[int, dict[Block, None]] = {}
        self.sliding = max_requests is not None or max_blocks is not None
        self.window: deque[Entry] = deque()
        self.refs: Counter[int] = Counter()  # sliding only: requests holding each block
        self.keys: dict[int, tuple[int, Block]] = {}  # sliding only: id -> (parent, block)
        self.tails: Counter[tuple[int, Block]] = Counter()  # sliding only
        self._roots: Counter[int] = Counter()  # sliding only: requests per root
        self._seen_roots: set[int] = set()  # audit only

    @property
    def blocks(self) -> int:
        """Distinct blocks held (full blocks, and in a window the partial tails too)."""
        return len(self.nodes) + len(self.tails)

    # -- adding a request ----------------------------------------------------------------------

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None) -> RequestResult:
        """Match a request against the earlier ones, then add it (the audit's pass)."""
        result, _ = self._add(tokens, extra_keys, 0.0)
        return result

    def add_timed(self, tokens: Sequence[int], extra_keys: Hashable = None, at: float = 0.0
                  ) -> tuple[Entry, Divergence | None]:
        """The sliding window's add: the request's window entry and its divergence."""
        result, entry = self._add(tokens, extra_keys, at)
        assert entry is not None
        return entry, result.divergence

    def _add(self, tokens: Sequence[int], extra_keys: Hashable, at: float
             ) -> tuple[RequestResult, Entry | None]:
        bs = self.bs
        n = len(tokens)
        root = root_id(extra_keys)
        ids = block_ids(tokens, bs, root)
        full = len(ids)
        nodes = self.nodes
        matched = longest_prefix(ids, nodes)
        parent = ids[matched - 1] if matched else root
        new_blocks = split_blocks(tokens[matched * bs:], bs)
        tail_block = tuple(tokens[full * bs:]) if full * bs < n else None
        seen = (self._roots[root] > 0) if self.sliding else (root in self._seen_roots)
        divergence = None
        if seen and matched * bs < n:
            rest = new_blocks[0] if new_blocks else tail_block
            assert rest is not None
            divergence = self._divergence(tokens, rest, parent, matched)
        # Insert this request's new full blocks in one C-level update, then its tail.
        if new_blocks:
            new = ids[matched:]
            firsts: list[Block | None] = list(new_blocks[1:])
            firsts.append(tail_block)
            nodes.update(zip(new, firsts, strict=True))
            if self.sliding:
                self.keys.update(zip(new, zip([parent, *new[:-1]], new_blocks, strict=True),
                                     strict=True))
            self._add_child(parent, new_blocks[0])
        elif tail_block is not None:
            self._add_child(parent, tail_block)
        result = RequestResult(n, cached_tokens_for(n, matched, bs), divergence)
        if not self.sliding:
            self._seen_roots.add(root)
            return result, None
        tail = (parent if full == matched else ids[-1], tail_block) if tail_block else None
        entry = Entry(at, extra_keys, ids, tail, n, result.cacheable_tokens, n > bs)
        self.refs.update(ids)
        if tail is not None:
            self.tails[tail] += 1
        self._roots[root] += 1
        self.window.append(entry)
        while (self.max_requests is not None and len(self.window) > self.max_requests) or (
                self.max_blocks is not None and self.blocks > self.max_blocks
                and len(self.window) > 1):
            self.drop_oldest()
        return result, entry

    def _add_child(self, parent: int, block: Block) -> None:
        """Record ``block`` as the newest child of ``parent`` (a root or a held block)."""
        branch = self.branches.get(parent)
        if branch is None:
            nodes = self.nodes
            if parent in nodes:
                first = nodes[parent]
                if first is None:
                    nodes[parent] = block  # the only child
                    return
                if first == block:
                    return
                branch = self.branches[parent] = {first: None}
            else:
                branch = self.branches[parent] = {}
        branch.setdefault(block, None)

    def children(self, parent: int) -> list[Block]:
        """The blocks that followed ``parent`` in earlier requests, oldest first."""
        return list(self._children(parent))

    def _children(self, parent: int) -> Sequence[Block] | dict[Block, None]:
        branch = self.branches.get(parent)
        if branch is not None:
            return branch
        first = self.nodes.get(parent)
        return (first,) if first is not None else ()

    # -- the sliding window --------------------------------------------------------------------

    def drop_oldest(self) -> Entry:
        """Take the oldest request out of the window, and the blocks only it held."""
        entry = self.window.popleft()
        root = root_id(entry.extra_keys)
        if entry.tail is not None:
            self.tails[entry.tail] -= 1
            if self.tails[entry.tail] == 0:
                del self.tails[entry.tail]
                self._remove_child(entry.tail[0], entry.tail[1])
        refs = self.refs
        for i in range(len(entry.ids) - 1, -1, -1):
            block_id = entry.ids[i]
            refs[block_id] -= 1
            if refs[block_id] == 0:
                del refs[block_id]
                del self.nodes[block_id]
                parent, key = self.keys.pop(block_id)
                self.branches.pop(block_id, None)
                self._remove_child(parent, key)
        self._roots[root] -= 1
        if self._roots[root] == 0:
            del self._roots[root]
        return entry

    def _remove_child(self, parent: int, block: Block) -> None:
        branch = self.branches.get(parent)
        nodes = self.nodes
        if branch is not None:
            branch.pop(block, None)
            if parent in nodes:
                # Keep one form for one state: the oldest child first, a branch from two on.
                if len(branch) <= 1:
                    del self.branches[parent]
                nodes[parent] = next(iter(branch), None)
            elif not branch:
                del self.branches[parent]
        elif nodes.get(parent) == block:
            nodes[parent] = None

    # -- where it diverges ---------------------------------------------------------------------

    def _divergence(self, tokens: Sequence[int], rest: Block, parent: int, matched: int
                    ) -> Divergence | None:
        """Where this request leaves every earlier one: ``rest`` is its block after the
        ``matched`` blocks it shares (full, or its partial tail)."""
        start = matched * self.bs
        recent = list(islice(reversed(self._children(parent)), RECENT_SIBLINGS))
        best, best_key = closest_sibling(recent, rest)
        if best_key is None:
            return None  # earlier requests ended here: this one extends them, nothing differs
        return divergence_at(tokens, start, len(rest), self.bs, best, best_key)


def common_prefix(a: Block, b: Block) -> int:
    """How many leading tokens two blocks share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def closest_sibling(recent: Sequence[Block], rest: Block) -> tuple[int, Block | None]:
    """Of the most recent earlier blocks that follow the same prefix (newest first), the one
    sharing the longest start with this request's diverging block ``rest`` (the newest on a
    tie). Blocks whose first token differs share nothing, so only the others are compared."""
    if not recent:
        return 0, None
    if not rest:
        return 0, recent[0]
    first = rest[0]
    best, best_key = 0, recent[0]
    for key in recent:
        if key and key[0] == first:
            shared = common_prefix(rest, key)
            if shared > best:
                best, best_key = shared, key
    return best, best_key


def divergence_at(tokens: Sequence[int], start: int, rest: int, block_size: int, best: int,
                  theirs_block: tuple[int, ...]) -> Divergence | None:
    """The divergence ``best`` tokens into the block at ``start`` (``rest`` tokens of this
    request from there), with the context on both sides."""
    if best == rest and rest < block_size:
        return None  # a shorter prompt that an earlier one continues: nothing differs
    position = start + best
    lo = max(0, position - CONTEXT_TOKENS)
    mine = tuple(tokens[lo:position + CONTEXT_TOKENS])
    theirs = tuple(tokens[lo:start]) + theirs_block
    return Divergence(position, mine, theirs, position - lo)
