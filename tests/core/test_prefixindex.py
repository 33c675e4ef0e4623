"""The one prefix index against brute force: vLLM's rule, its chained ids, its sliding window."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.core.prefixindex import PrefixIndex, block_ids, child_id, root_id
from tests.core.test_blockcache import reference_cached

EXTRAS = [None, ("lora", None), (None, "salt"), ("lora", "salt", ("mm-hash",))]
requests = st.lists(st.tuples(st.lists(st.integers(0, 3), max_size=40),
                              st.sampled_from(EXTRAS)), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(requests, st.sampled_from([1, 2, 3, 4, 16]))
def test_cached_tokens_equal_vllms_rule_by_brute_force(batch, bs: int) -> None:
    """Whole blocks of the longest common prefix with an earlier request of the same extra
    keys, never past n - 1 tokens; the divergence is the longest common prefix itself."""
    index = PrefixIndex(bs)
    history: list[tuple[list[int], object]] = []
    for tokens, extra in batch:
        result = index.add(tokens, extra)
        assert result.cacheable_tokens == (reference_cached(history, tokens, extra, bs)
                                           if tokens else 0)
        same = [p for p, e in history if e == extra]
        if result.divergence is not None:
            lcps = []
            for p in same:
                k = 0
                while k < min(len(p), len(tokens)) and p[k] == tokens[k]:
                    k += 1
                lcps.append(k)
            assert result.divergence.position == max(lcps)
        history.append((tokens, extra))


@settings(max_examples=100, deadline=None)
@given(requests, st.integers(1, 6), st.integers(1, 5), st.integers(1, 60))
def test_sliding_window_equals_a_fresh_index_of_its_window(batch, bs: int, keep: int,
                                                          max_blocks: int) -> None:
    """Bounded by requests and by blocks: each request sees exactly the requests still in the
    window before it (the most recent ones), and the window holds exactly their blocks."""
    sliding = PrefixIndex(bs, max_requests=keep, max_blocks=max_blocks)
    for i, (tokens, extra) in enumerate(batch):
        fresh = PrefixIndex(bs)
        for earlier, earlier_extra in batch[i - len(sliding.window):i]:
            fresh.add(earlier, earlier_extra)
        expected = fresh.add(tokens, extra)
        entry, divergence = sliding.add_timed(tokens, extra)
        assert entry.cacheable_tokens == expected.cacheable_tokens
        assert (divergence.position if divergence else None) == (
            expected.divergence.position if expected.divergence else None)
        assert len(sliding.window) <= keep
        assert sliding.blocks <= max_blocks or len(sliding.window) == 1
        held = PrefixIndex(bs, max_requests=10_000)
        for earlier, earlier_extra in batch[i + 1 - len(sliding.window):i + 1]:
            held.add_timed(earlier, earlier_extra)
        assert sliding.nodes == held.nodes and sliding.blocks == held.blocks
        assert sliding.branches == held.branches


@given(st.lists(st.integers(0, 2**32 - 1), max_size=64), st.integers(1, 8),
       st.sampled_from(EXTRAS))
def test_one_chain_step_equals_the_vectorised_chain(tokens, bs: int, extra) -> None:
    ids = block_ids(tokens, bs, root_id(extra))
    parent = root_id(extra)
    for depth, start in enumerate(range(0, len(tokens) - len(tokens) % bs, bs)):
        parent = child_id(parent, depth, tuple(tokens[start:start + bs]))
        assert parent == ids[depth]
