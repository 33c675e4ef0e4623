"""The one prefix index against brute force: vLLM's rule, the exact divergence, its window."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.core.cache.prefixindex import BEFORE_TOKENS, CONTEXT_TOKENS, Node, PrefixIndex
from tests.core.test_blockcache import reference_cached

EXTRAS = [None, ("lora", None), (None, "salt"), ("lora", "salt", ("mm-hash",))]
requests = st.lists(st.tuples(st.lists(st.integers(0, 3), max_size=40),
                              st.sampled_from(EXTRAS)), min_size=1, max_size=25)


def lcp(a, b) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def check_divergence(history, tokens, extra, divergence) -> None:
    """The exact LCP with any earlier request of the same extra keys; a divergence exactly
    where an earlier request that shares it has a token there too, and theirs is one's."""
    same = [p for p, e in history if e == extra]
    best = max((lcp(p, tokens) for p in same), default=0)
    differs = [p for p in same if lcp(p, tokens) == best and len(p) > best < len(tokens)]
    assert (divergence is not None) == bool(differs)
    if divergence is not None:
        assert divergence.position == best
        at, off = divergence.position, divergence.offset
        assert divergence.mine == tuple(tokens[at - off:at + CONTEXT_TOKENS])
        assert divergence.theirs[:off] == divergence.mine[:off]
        theirs = divergence.theirs[off:]
        assert any(tuple(p[at:at + len(theirs)]) == theirs
                   and len(theirs) == min(CONTEXT_TOKENS, len(p) - at) for p in differs)


def distinct_blocks(held, bs: int) -> int:
    return len({(e, tuple(p[:k])) for p, e in held for k in range(bs, len(p) + 1, bs)})


def canonical(node: Node) -> tuple:
    """The trie as a value, children in any order: equal tries hold the same requests."""
    kids = sorted(canonical(c) for c in node.children.values())
    return tuple(node.edge), node.end, node.count, tuple(kids)


def tries(index: PrefixIndex) -> dict:
    return {extra: canonical(root) for extra, root in index.roots.items()}


@settings(max_examples=200, deadline=None)
@given(requests, st.sampled_from([1, 2, 3, 4, 16]))
def test_cached_tokens_and_divergence_equal_brute_force(batch, bs: int) -> None:
    """Whole blocks of the longest common prefix with an earlier request of the same extra
    keys, never past n - 1 tokens; the divergence is the longest common prefix itself."""
    index = PrefixIndex(bs)
    history: list[tuple[list[int], object]] = []
    for tokens, extra in batch:
        before = index.reach(tokens, extra)
        result = index.add(tokens, extra)
        assert result.cacheable_tokens == (reference_cached(history, tokens, extra, bs)
                                           if tokens else 0)
        check_divergence(history, tokens, extra, result.divergence)
        assert before == max((lcp(p, tokens) for p, e in history if e == extra), default=0)
        history.append((tokens, extra))
        assert index.blocks == distinct_blocks(history, bs)


@settings(max_examples=150, deadline=None)
@given(requests, st.integers(1, 6), st.integers(1, 5), st.integers(1, 60))
def test_sliding_window_equals_a_fresh_index_of_its_window(batch, bs: int, keep: int,
                                                          max_blocks: int) -> None:
    """Bounded by requests and by blocks: each request sees exactly the requests still in the
    window before it (the most recent ones), and the window holds exactly their tokens, as
    the compressed trie a fresh index of them would build."""
    sliding = PrefixIndex(bs, max_requests=keep, max_blocks=max_blocks)
    for i, (tokens, extra) in enumerate(batch):
        window = batch[i - len(sliding.window):i]
        entry, divergence = sliding.add_timed(tokens, extra)
        assert entry.cacheable_tokens == (reference_cached(window, tokens, extra, bs)
                                          if tokens else 0)
        check_divergence(window, tokens, extra, divergence)
        assert len(sliding.window) <= keep
        assert sliding.blocks <= max_blocks or len(sliding.window) == 1
        held = PrefixIndex(bs, max_requests=10_000)
        kept = batch[i + 1 - len(sliding.window):i + 1]
        for earlier, earlier_extra in kept:
            held.add_timed(earlier, earlier_extra)
        assert tries(sliding) == tries(held)
        assert sliding.blocks == held.blocks == distinct_blocks(kept, bs)
    while sliding.window:
        sliding.drop_oldest()
    assert sliding.blocks == 0 and not sliding.roots


def test_window_memory_is_bounded_on_a_long_log() -> None:
    rng = random.Random(5)
    system = [rng.randrange(2**32) for _ in range(300)]
    index = PrefixIndex(16, max_requests=40, max_blocks=500)
    for i in range(3_000):
        stamp = [i % 7] if i % 3 == 0 else []
        tokens = system[:5] + stamp + system[5:rng.randrange(5, 300)] + [
            rng.randrange(2**32) for _ in range(rng.randrange(0, 200))]
        index.add_timed(tokens, EXTRAS[i % 2])
        assert len(index.window) <= 40 and index.blocks <= 500 + 500 // 16 + 1
    nodes = sum(1 for _ in walk(index))
    assert nodes <= 2 * 40 + len(index.roots)


def walk(index: PrefixIndex):
    stack = list(index.roots.values())
    while stack:
        node = stack.pop()
        yield node
        stack.extend(node.children.values())


def test_reach_and_insert_for_the_ledger() -> None:
    index = PrefixIndex(4)
    assert index.reach([1, 2, 3]) == 0
    entry = index.insert([1, 2, 3, 4, 5, 6])
    assert entry.reach == 0 and entry.cacheable_tokens == 0
    assert index.reach([1, 2, 3, 4, 5, 9]) == 5 and index.cacheable([1, 2, 3, 4, 5, 9]) == 4
    assert index.reach([1, 2, 3, 4, 5, 6]) == 6 and index.cacheable([1, 2, 3, 4, 5, 6]) == 4
    assert index.reach([1, 2, 3, 4, 5, 6], "lora") == 0
    assert index.insert([1, 2, 3, 4, 5, 9]).reach == 5
    assert index.blocks == 1


def test_known_divergence_context() -> None:
    index = PrefixIndex(4)
    index.add(list(range(100, 140)))
    index.add(list(range(100, 120)) + [7, 8])  # diverges at 20, inside the first edge
    result = index.add(list(range(100, 120)) + [9])
    d = result.divergence
    assert d is not None and d.position == 20 and d.offset == min(20, BEFORE_TOKENS)
    assert d.mine == tuple(range(100, 120)) + (9,)
    assert d.theirs == tuple(range(100, 120)) + (7, 8)  # the most recent one that differs
    assert index.add(list(range(100, 130))).divergence is None  # a prefix of an earlier one
