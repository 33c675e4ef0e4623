"""The prefix index: every earlier request's full token blocks as a trie, vLLM's rule.

Linear in the total number of tokens: each request is matched against all earlier ones
at once (one look-up per block, the identity of vLLM's chained block hashes), and its
divergence from the closest earlier request is exact to the token.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from prefixwatch.core.blockcache import cached_tokens_for

RECENT_SIBLINGS = 32
CONTEXT_TOKENS = 12


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


class PrefixIndex:
    """Every earlier request's full blocks, as a trie per extra-key set."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.roots: dict[Hashable, dict] = {}
        self.blocks = 0

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None) -> RequestResult:
        bs = self.bs
        n = len(tokens)
        t = tuple(tokens)
        full = n - n % bs
        root = self.roots.get(extra_keys)
        seen_before = root is not None
        if root is None:
            root = self.roots[extra_keys] = {}
        node = root
        matched = 0
        for start in range(0, full, bs):
            child = node.get(t[start:start + bs])
            if child is None:
                break
            node = child
            matched += 1
        cacheable = cached_tokens_for(n, matched, bs)
        divergence = self._divergence(t, node, matched) if seen_before else None
        # Insert the rest of this request's full blocks, and its partial tail: the tail is
        # never a cache hit (a lookup asks for full blocks only) but later requests measure
        # their common prefix against it.
        for start in range(matched * bs, full, bs):
            child: dict = {}
            node[t[start:start + bs]] = child
            node = child
            self.blocks += 1
        if full < n:
            node.setdefault(t[full:], {})
        return RequestResult(n, cacheable, divergence)

    def _divergence(self, t: tuple[int, ...], node: dict, matched: int) -> Divergence | None:
        bs = self.bs
        start = matched * bs
        if start >= len(t):
            return None  # every full block matched and nothing is left: no divergence
        rest = t[start:start + bs]

        def common(key: tuple[int, ...]) -> int:
            n = 0
            for a, b in zip(rest, key, strict=False):
                if a != b:
                    break
                n += 1
            return n

        best, best_key = closest_sibling(reversed(node), common)
        if best_key is None:
            return None  # earlier requests ended here: this one extends them, nothing differs
        return divergence_at(t, start, len(rest), bs, best, tuple(best_key))


K = TypeVar("K")


def closest_sibling(siblings: Iterable[K], common: Callable[[K], int]) -> tuple[int, K | None]:
    """Of the RECENT_SIBLINGS most recent earlier blocks that follow the same prefix (newest
    first), the one sharing the longest start with this request's diverging block."""
    best, best_key = 0, None
    for i, key in enumerate(siblings):
        if i >= RECENT_SIBLINGS:
            break
        shared = common(key)
        if shared > best or best_key is None:
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
