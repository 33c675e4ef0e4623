"""The caching rule, on hand-computed cases and against a brute-force reference."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.core.cache.blockcache import (
    BlockPool,
    Residency,
    block_ids,
    cached_tokens_for,
    child_id,
    root_id,
)
from prefixwatch.simulator.engine import Engine, EngineConfig, VirtualClock


def engine(num_blocks: int = 4096, block_size: int = 16, caching: bool = True) -> Engine:
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size,
                       enable_prefix_caching=caching, time_per_output_token=0.001)
    return Engine(cfg, clock=VirtualClock())


def run(eng: Engine, prompt: list[int], extra=None, max_tokens: int = 1) -> int:
    """Send one request after the previous finished; its cached tokens."""
    req = eng.submit(prompt, max_tokens, extra)
    eng.run_until_idle()
    return req.cached_tokens


def tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 50000) for _ in range(n)]


def test_repeat_of_the_same_prompt_hits_all_but_the_last_block() -> None:
    eng = engine()
    prompt = tokens(2400)
    assert run(eng, prompt) == 0
    assert run(eng, prompt) == 2384  # 149 of 150 blocks: the last token is always recomputed
    assert eng.stats.prefix_queries == 4800 and eng.stats.prefix_hits == 2384


@pytest.mark.parametrize("position,blocks", [(8, 0), (2390, 149), (16, 1), (1600, 100)])
def test_change_at_a_token_keeps_the_blocks_before_it(position: int, blocks: int) -> None:
    eng = engine()
    prompt = tokens(2400)
    run(eng, prompt)
    changed = list(prompt)
    changed[position] += 1
    assert run(eng, changed) == blocks * 16


def test_partial_blocks_and_short_prompts() -> None:
    eng = engine()
    assert run(eng, tokens(15)) == 0
    assert run(eng, tokens(15)) == 0  # under one block: never cached
    assert run(eng, tokens(17, 1)) == 0
    assert run(eng, tokens(17, 1)) == 16
    assert run(eng, tokens(16, 2)) == 0
    assert run(eng, tokens(16, 2)) == 0  # 16 tokens: the only block holds the last token
    assert cached_tokens_for(2400, 150, 16) == 2384
    assert cached_tokens_for(1, 5, 16) == 0


def test_lora_and_cache_salt_isolate() -> None:
    eng = engine()
    prompt = tokens(800)
    run(eng, prompt)
    assert run(eng, prompt, extra=("adapter-a", None)) == 0
    assert run(eng, prompt, extra=("adapter-a", None)) == 784
    assert run(eng, prompt, extra=(None, "tenant-1")) == 0
    assert run(eng, prompt, extra=(None, "tenant-2")) == 0
    assert run(eng, prompt, extra=(None, "tenant-1")) == 784
    assert run(eng, prompt) == 784


def test_output_blocks_are_cached_for_the_next_turn() -> None:
    eng = engine()
    prompt = tokens(100)
    req = eng.submit(prompt, 40)
    eng.run_until_idle()
    follow_up = prompt + req.output + tokens(30, 9)
    # 100 prompt + 40 output = 140 tokens, 139 computed: 8 full blocks (128 tokens) cached.
    assert run(eng, follow_up) == 128


def test_caching_disabled_never_hits() -> None:
    eng = engine(caching=False)
    prompt = tokens(500)
    run(eng, prompt)
    assert run(eng, prompt) == 0
    assert eng.stats.prefix_queries == 1000


def test_lru_eviction_under_a_small_pool() -> None:
    # 10 usable blocks (1..10); each 64-token prompt takes 4. Worked by hand, as vLLM does it:
    eng = engine(num_blocks=11)
    a, b, c = tokens(64, 1), tokens(64, 2), tokens(64, 3)
    run(eng, a)  # a -> 1,2,3,4; freed tail first: queue 5..10,4,3,2,1
    run(eng, b)  # b -> 5,6,7,8; queue 9,10,4,3,2,1,8,7,6,5
    assert run(eng, a) == 48  # hits 1,2,3; its 4th block is recomputed into 9
    run(eng, c)  # c -> 10,4,8,7: evicts a's spare 4th block and b's 3rd and 4th
    assert run(eng, a) == 48  # a's head blocks were freed last, so they survived
    # ...and a's new 4th block came from the head of the queue: b's 2nd block (6).
    assert eng.pool.evictions == 4
    assert run(eng, b) == 16


def test_tail_blocks_are_evicted_before_head_blocks() -> None:
    pool = BlockPool(num_blocks=6, block_size=2)
    root = pool.root(None)
    blocks = pool.allocate(3)
    node = root
    for i, b in enumerate(blocks):
        node = pool.cache(node, (i, i), b)
    pool.release(blocks)
    # Freed tail first: the queue now starts with the 2 never-used blocks, then the tail.
    pool.allocate(3)
    ids = pool.ids_of([0, 0, 1, 1, 2, 2])
    assert [node.id for node in pool.longest_hit(ids, 3)] == ids[:2]


def test_pool_pressure_preempts_and_waits() -> None:
    eng = engine(num_blocks=40)
    reqs = [eng.submit(tokens(200, i), 100) for i in range(6)]
    eng.run_until_idle(step=0.002)
    assert all(r.done.is_set() and r.error is None for r in reqs)
    assert eng.stats.preemptions > 0
    assert eng.stats.requests == 6  # preempted re-admissions are not counted again
    assert eng.pool.num_free == eng.pool.usable_blocks


def test_usage_is_vllms() -> None:
    eng = engine(num_blocks=101)
    req = eng.submit(tokens(160), 50)
    eng.step()
    assert eng.kv_usage == pytest.approx(10 / 100)  # 160 prompt tokens: 10 blocks
    eng.run_until_idle()
    assert req.done.is_set() and eng.kv_usage == 0.0


def reference_cached(history: list[tuple[list[int], object]], prompt: list[int], extra: object,
                     bs: int) -> int:
    """Brute force: the longest common prefix with any earlier request of the same extra keys
    (whose prompt was computed in full), in whole blocks, within the first n - 1 tokens."""
    best = 0
    for earlier, earlier_extra in history:
        if earlier_extra != extra:
            continue
        n = 0
        while n < min(len(earlier), len(prompt)) and earlier[n] == prompt[n]:
            n += 1
        best = max(best, n // bs * bs)
    return min(best, (len(prompt) - 1) // bs * bs)


@settings(max_examples=120, deadline=None)
@given(data=st.data(), bs=st.sampled_from([1, 2, 4, 16]))
def test_cached_tokens_equal_the_reference(data, bs: int) -> None:
    """Without eviction, every request's cached tokens equal the brute-force answer."""
    eng = engine(num_blocks=100_000, block_size=bs)
    base = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=40))
    history: list[tuple[list[int], object]] = []
    for _ in range(data.draw(st.integers(1, 12))):
        cut = data.draw(st.integers(0, len(base)))
        tail = data.draw(st.lists(st.integers(1, 3), max_size=20))
        prompt = base[:cut] + tail or [1]
        extra = data.draw(st.sampled_from([None, ("lora", None), (None, "salt")]))
        want = reference_cached(history, prompt, extra, bs)
        req = eng.submit(prompt, 1, extra)
        eng.run_until_idle()
        assert req.cached_tokens == want
        # With one output token, the KV of the prompt (not the output) is computed.
        history.append((prompt, extra))


def test_block_residency_as_vllms_kv_cache_metrics() -> None:
    """Lifetime from allocation, idle from the last hit, reuse gaps between hits."""
    clock = VirtualClock(100.0)
    pool = BlockPool(4, 2)  # 3 usable blocks of 2 tokens
    pool.residency = Residency(clock, sample_rate=1.0)
    events: list[tuple[float, float, list[float]]] = []
    pool.residency.listeners.append(lambda *e: events.append(e))
    a = pool.admit([1, 2, 3, 4, 9])  # blocks [1,2] [3,4] cached, and a tail block
    assert a is not None
    pool.release(a.blocks)
    clock.now = 110.0
    b = pool.admit([1, 2, 3, 4, 8])  # hits both blocks: an access each
    assert b is not None and b.cached_tokens == 4
    pool.release(b.blocks)
    clock.now = 130.0
    c = pool.admit([5, 6, 7, 8, 7])  # needs all 3 blocks: evicts the two cached ones
    assert c is not None and c.cached_tokens == 0
    # Born at 100, last hit at 110, evicted at 130; one access, so no gap yet. The uncached
    # tail block that was reused in between is not an eviction.
    assert events == [(30.0, 20.0, []), (30.0, 20.0, [])]
    pool.reset()
    assert pool.residency is not None and not pool.residency.listeners


def test_residency_sampling() -> None:
    clock = VirtualClock()
    pool = BlockPool(1001, 1)
    pool.residency = Residency(clock, sample_rate=0.1, seed=3)
    events = []
    pool.residency.listeners.append(lambda *e: events.append(e))
    for i in range(20):
        admitted = pool.admit(list(range(i * 100, i * 100 + 101)))
        assert admitted is not None
        pool.release(admitted.blocks)
    assert 0.05 * pool.evictions < len(events) < 0.2 * pool.evictions


@given(st.lists(st.integers(0, 2**32 - 1), max_size=64), st.integers(1, 8),
       st.sampled_from([None, ("lora", None), (None, "salt"), ("lora", "salt", ("mm-hash",))]))
def test_one_chain_step_equals_the_vectorised_chain(tokens, bs: int, extra) -> None:
    """The pool's chained block ids: one step at a time equals one numpy pass."""
    ids = block_ids(tokens, bs, root_id(extra))
    parent = root_id(extra)
    for depth, start in enumerate(range(0, len(tokens) - len(tokens) % bs, bs)):
        parent = child_id(parent, depth, tuple(tokens[start:start + bs]))
        assert parent == ids[depth]
