"""The pool what-if of one mirror (core/kv/whatif.py): distances, the prefix rule, the caps."""

from __future__ import annotations

from prefixwatch.core.kv.codec import AllBlocksCleared, Batch, BlockRemoved, BlockStored
from prefixwatch.core.kv.mirror import FleetContent, TargetMirror
from prefixwatch.core.kv.whatif import MIN_REBUILD
from prefixwatch.core.vocab import exposition

BS = 16


def toks(seed: int, blocks: int) -> list[int]:
    return [(seed * 7919 + i) % 30000 + 1 for i in range(blocks * BS)]


def stored(hashes, parent=None, tokens=None, medium="GPU") -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_block_hash=parent,
                       token_ids=tokens or [], block_size=BS, lora_id=None, medium=medium,
                       lora_name=None)


def removed(hashes, medium="GPU") -> BlockRemoved:
    return BlockRemoved(block_hashes=list(hashes), medium=medium)


def feed(m: TargetMirror, *events) -> None:
    m.apply(Batch(0.0, list(events)))


def mirror(pool: int | None = 8) -> TargetMirror:
    m = TargetMirror(FleetContent("m"))
    m.whatif.set_pool(pool)
    return m


def test_a_prompt_stored_again_gains_in_each_pool_its_distance_fits() -> None:
    m = mirror(8)
    a = toks(1, 2)
    feed(m, stored([1, 2], tokens=a), *[stored([100 + i], tokens=toks(50 + i, 1))
                                        for i in range(5)])
    # A request's allocation evicts a's chain, tail first, then stores its own block; five
    # more requests each evict one block before storing theirs.
    feed(m, removed([2]), removed([1]), stored([200], tokens=toks(70, 1)))
    for i in range(5):
        feed(m, removed([100 + i]), stored([201 + i], tokens=toks(80 + i, 1)))
    feed(m, stored([3, 4], tokens=a))  # a again: both blocks computed again (eviction)
    # Block 2 went at removal 0, block 1 at removal 1; 7 removals before this request: the
    # distances are 6 and 7. Extra blocks: 1.25x 2, 1.5x 4, 2x 8, 4x 24.
    assert m.snapshot().computed["eviction"] == 2 * BS
    assert m.snapshot().whatif == {"1.25": 0, "1.5": 0, "2": 2 * BS, "4": 2 * BS}


def test_the_removals_just_before_a_store_are_its_own_allocation() -> None:
    m = mirror(8)
    a = toks(1, 2)
    feed(m, stored([1, 2], tokens=a), *[stored([100 + i], tokens=toks(50 + i, 1))
                                        for i in range(5)])
    feed(m, removed([2]), removed([1]), *[removed([100 + i]) for i in range(5)])
    feed(m, stored([3, 4], tokens=a))  # the 7 removals made room for this very request
    assert m.snapshot().whatif == {"1.25": 2 * BS, "1.5": 2 * BS, "2": 2 * BS, "4": 2 * BS}


def test_the_run_stops_at_its_first_block_no_pool_would_serve() -> None:
    m = mirror(2)  # extra blocks: 1.25x 0, 1.5x 1, 2x 2, 4x 6
    a = toks(2, 3)
    feed(m, stored([1, 2, 3], tokens=a))
    feed(m, removed([1]), stored([200], tokens=toks(60, 1)))  # a's first block, long ago
    for i in range(4):
        feed(m, stored([100 + i], tokens=toks(61 + i, 1)))
    for i in range(4):
        feed(m, removed([100 + i]), stored([201 + i], tokens=toks(70 + i, 1)))
    feed(m, removed([3]), removed([2]), stored([300], tokens=toks(80, 1)))
    feed(m, stored([11, 12, 13], tokens=a))
    # Block 1 went 7 removals before this request: no pool up to 4x (6 more blocks) held
    # it, so none of the chain is served, though its later blocks went only 1 and 2 ago.
    assert m.snapshot().computed["eviction"] == 3 * BS
    assert m.snapshot().whatif == {"1.25": 0, "1.5": 0, "2": 0, "4": 0}


def test_a_decode_step_continuing_the_last_store_never_gains() -> None:
    m = mirror(8)
    a = toks(3, 1)
    feed(m, stored([1], tokens=a))
    feed(m, removed([1]))
    feed(m, stored([5], tokens=toks(4, 1)))  # a prompt's block
    feed(m, stored([1], parent=5, tokens=a))  # the next block of the same request: a decode
    # (its content is not the evicted block's: another parent), and nothing gains.
    assert m.snapshot().whatif["4"] == 0


def test_without_a_pool_size_there_is_no_what_if_until_it_is_known() -> None:
    m = mirror(None)
    a = toks(5, 1)
    feed(m, stored([1], tokens=a), removed([1]), stored([2], tokens=a))
    assert m.snapshot().whatif == {} and m.snapshot().pool_blocks is None
    m.whatif.set_pool(8)  # the first poll: what was stored again before it counts
    assert m.snapshot().whatif == {"1.25": BS, "1.5": BS, "2": BS, "4": BS}


def test_all_blocks_cleared_forgets_the_ghosts() -> None:
    m = mirror(8)
    a = toks(6, 1)
    feed(m, stored([1], tokens=a), removed([1]), AllBlocksCleared())
    assert not m.whatif.ghosts
    feed(m, stored([2], tokens=a))
    assert m.snapshot().whatif["4"] == 0


def test_ghosts_stay_bounded_by_the_largest_pools_reach_and_by_the_cap() -> None:
    m = mirror(10)  # 4x reaches 30 removals back: what is older goes at each rebuild
    for i in range(3 * MIN_REBUILD):
        feed(m, stored([i], tokens=toks(1000 + i, 1)), removed([i]))
        assert len(m.whatif.ghosts) <= MIN_REBUILD + 1
    m.whatif._forget()  # what every rebuild keeps: the largest pool's reach
    assert len(m.whatif.ghosts) <= 30
    assert m.snapshot().errors.get(exposition.KV_ERROR_GHOSTS_FULL, 0) == 0
    capped = TargetMirror(FleetContent("m"))
    capped.whatif.max_ghosts = 50
    capped.whatif.set_pool(1000)  # reach 3000: the cap bites first, and is counted
    for i in range(2000):
        feed(capped, stored([i], tokens=toks(1000 + i, 1)), removed([i]))
    assert len(capped.whatif.ghosts) <= 51
    assert capped.snapshot().errors[exposition.KV_ERROR_GHOSTS_FULL] >= 1900

