"""The mirror alone (core/kv/mirror.py): copies, tiers, identity, caps; and the config keys."""

from __future__ import annotations

import pytest

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.kv.codec import AllBlocksCleared, Batch, BlockRemoved, BlockStored
from prefixwatch.core.kv.mirror import FleetContent, TargetMirror
from prefixwatch.exporter.config import ConfigFlags, build_config

BS = 16


def tokens(seed: int, blocks: int = 1) -> list[int]:
    return [(seed * 7919 + i) % 30000 for i in range(blocks * BS)]


def store(hashes, parent=None, toks=None, medium="GPU", lora=None, extra=None) -> BlockStored:
    return BlockStored(block_hashes=list(hashes), parent_block_hash=parent,
                       token_ids=[] if toks is None else toks, block_size=BS, lora_id=None,
                       medium=medium, lora_name=lora, extra_keys=extra)


def apply(mirror: TargetMirror, *events, ts: float = 0.0) -> None:
    mirror.apply(Batch(ts, list(events)))


def test_copies_are_counted_and_removed_one_by_one() -> None:
    m = TargetMirror(FleetContent("m"))
    apply(m, store([1], toks=tokens(1)), ts=10.0)
    apply(m, store([1], toks=tokens(1)), ts=20.0)  # a second physical copy
    assert m.snapshot().resident == {"GPU": 2}
    apply(m, BlockRemoved(block_hashes=[1], medium="GPU"), ts=25.0)
    snap = m.snapshot()
    assert snap.resident == {"GPU": 1} and snap.removed == {"GPU": 1}
    buckets, total = snap.lifetimes["GPU"]
    assert total == 15.0  # the oldest copy went
    apply(m, BlockRemoved(block_hashes=[1, 99], medium="GPU"), ts=26.0)
    snap = m.snapshot()
    assert snap.resident == {"GPU": 0} and snap.errors == {"unknown_block": 1}


def test_all_blocks_cleared_empties_the_mirror_without_an_eviction() -> None:
    m = TargetMirror(FleetContent("m"))
    apply(m, store([1, 2], toks=tokens(1, 2)))
    apply(m, AllBlocksCleared())
    assert m.snapshot().resident == {"GPU": 0}
    apply(m, store([3, 4], toks=tokens(1, 2)))  # the same content again
    assert m.snapshot().computed["eviction"] == 0


def test_identity_is_content_across_replicas_and_lora_keeps_it_apart() -> None:
    fleet = FleetContent("m")
    a, b = TargetMirror(fleet), TargetMirror(fleet)
    apply(a, store([11, 12], toks=tokens(5, 2)))
    apply(b, store([901, 902], toks=tokens(5, 2)))  # other hashes, same content
    assert b.snapshot().computed["routing"] == 2 * BS
    apply(b, store([903], toks=tokens(5), lora="adapter"))  # same tokens, another adapter
    assert b.snapshot().computed["routing"] == 2 * BS
    apply(b, store([904], toks=tokens(6), extra=[["salt"]]))
    apply(a, store([13], toks=tokens(6)))  # no salt: another content
    assert a.snapshot().computed["routing"] == 0


def test_eviction_then_recompute_and_a_lower_tier_joined_by_hash() -> None:
    m = TargetMirror(FleetContent("m"))
    apply(m, store([1, 2], toks=tokens(3, 2)))
    apply(m, BlockRemoved(block_hashes=[1, 2], medium="GPU"))
    apply(m, store([1, 2], toks=tokens(3, 2)))
    assert m.snapshot().computed["eviction"] == 2 * BS
    # A CPU tier that sends no token ids: its blocks join the device's by hash.
    apply(m, store([1, 2], parent=None, medium="CPU"))
    apply(m, BlockRemoved(block_hashes=[1, 2], medium="GPU"))
    apply(m, store([1, 2], toks=tokens(3, 2)))
    snap = m.snapshot()
    assert snap.loaded == {"CPU": 2 * BS}
    assert snap.computed["eviction"] == 2 * BS  # unchanged: loaded, not computed
    assert snap.resident == {"GPU": 2, "CPU": 2}


def test_bytes_hashes_unknown_parents_and_bad_token_counts() -> None:
    m = TargetMirror(FleetContent("m"))
    h = [b"\x01" * 32, b"\x02" * 32]
    apply(m, store(h, toks=tokens(4, 2)))
    apply(m, store([b"\x03" * 32], parent=h[1], toks=tokens(8)))
    apply(m, store([b"\x04" * 32], parent=b"\x09" * 32, toks=tokens(9)))
    apply(m, store([b"\x05" * 32], toks=tokens(9)[:5]))
    snap = m.snapshot()
    assert snap.resident == {"GPU": 5}
    assert snap.errors == {"unknown_parent": 1, "token_count": 1}


def test_the_caps_are_counted() -> None:
    m = TargetMirror(FleetContent("m", max_blocks=50), max_resident=10)
    apply(m, store(range(8), toks=tokens(1, 8)))
    apply(m, store(range(100, 108), toks=tokens(2, 8)))
    snap = m.snapshot()
    assert snap.resident == {"GPU": 10} and snap.stored == {"GPU": 16}
    assert snap.errors["mirror_full"] == 6
    apply(m, BlockRemoved(block_hashes=list(range(8)) + list(range(100, 102)), medium="GPU"))
    for i in range(10):
        apply(m, store(range(1000 + 8 * i, 1008 + 8 * i), toks=tokens(10 + i, 8)))
        apply(m, BlockRemoved(block_hashes=list(range(1000 + 8 * i, 1008 + 8 * i)),
                              medium="GPU"))
    assert len(m.fleet.blocks) <= 50
    assert m.snapshot().errors["history_full"] > 0


def test_the_config_keys_and_their_errors(tmp_path) -> None:
    cfg = build_config(ConfigFlags(targets=["http://h:8000/metrics"],
                                   kv_events="tcp://h:5557"), environ={})
    assert cfg.targets[0].kv_events == "tcp://h:5557"
    for bad in ("h:5557", "tcp://h", "tcp://h:70000", "http://h:5557"):
        with pytest.raises(ConfigError, match="KV events endpoint"):
            build_config(ConfigFlags(targets=["http://h:8000/metrics"], kv_events=bad), environ={})
    with pytest.raises(ConfigError, match="one target"):
        build_config(ConfigFlags(targets=["http://a:1/metrics", "http://b:1/metrics"],
                                 kv_events="tcp://h:5557"), environ={})
    path = tmp_path / "c.yml"
    path.write_text("kv_events_listen: tcp://0.0.0.0:*\nkv_events_topics: {t: nobody}\n"
                    "targets: [{url: 'http://a:1/metrics', name: a}]\n")
    with pytest.raises(ConfigError, match="names no target"):
        build_config(ConfigFlags(config_file=str(path)), environ={})
    path.write_text("targets: [{url: 'http://a:1/metrics', kv_events: 'tcp://a:5557', "
                    "kv_events_replay: 'tcp://a:5558', kv_events_topic: kv-events}]\n")
    target = build_config(ConfigFlags(config_file=str(path)), environ={}).targets[0]
    assert (target.kv_events_replay, target.kv_events_topic) == ("tcp://a:5558", "kv-events")


def _check_against_the_ledger(monkeypatch) -> list[int]:
    """Every ``layoutsearch.layout_end_packed`` call also answered by ``ledger.layout_end_from``:
    the packed-word search must return the same index; returns the answers."""
    from array import array

    from prefixwatch.core.cache.layoutpart import layout_end_from
    from prefixwatch.core.kv import layoutsearch

    answers: list[int] = []
    fast = layoutsearch.layout_end_packed

    class TrieView:
        """A mirror block as ``core.layout``'s nodes: its edge, its end and its children,
        of which the search follows only the most recent, all a block keeps (``last``)."""

        def __init__(self, block) -> None:
            self.edge, self.end, self.block = block.edge, block.end, block

        @property
        def children(self) -> dict:
            last = self.block.last
            return {} if last is None else {last.cid: TrieView(last)}

    def both(words, d, first, depth, bs):
        q = array("I")
        q.frombytes(words)
        got = fast(words, d, first, depth, bs)
        assert got == layout_end_from(q, d, TrieView(first), depth, bs)
        answers.append(got)
        return got

    monkeypatch.setattr(layoutsearch, "layout_end_packed", both)
    return answers


def test_the_packed_layout_search_is_the_ledgers_on_both_recordings(monkeypatch) -> None:
    import base64
    import json
    from pathlib import Path

    from prefixwatch.exporter.kvsubscriber.source import FleetRegistry, KvSource

    answers = _check_against_the_ledger(monkeypatch)
    fixtures = Path(__file__).resolve().parent.parent / "fixtures" / "kv_events"
    fleets, sources = FleetRegistry(), {}
    for name in ("fleet", "offload"):
        for line in (fixtures / name / "kv_events.jsonl").read_text().splitlines():
            row = json.loads(line)
            key = f"{name}/{row['topic']}"
            source = sources.setdefault(key, KvSource(key, fleets))
            source.ingest([row["topic"].encode(), row["seq"].to_bytes(8, "big"),
                           base64.b64decode(row["payload_b64"])])
    assert any(answers) and 0 in answers  # both outcomes were exercised


def test_the_packed_layout_search_is_the_ledgers_on_random_chains(monkeypatch) -> None:
    import random

    answers = _check_against_the_ledger(monkeypatch)
    rng = random.Random(7)
    m = TargetMirror(FleetContent("m"))
    base = tokens(1, 40)
    h = 0
    for _ in range(300):
        toks = list(base)
        for _ in range(rng.randrange(4)):  # a few short edits: layout after them, or novel
            at = rng.randrange(len(toks))
            edit = [rng.randrange(5) for _ in range(rng.randrange(1, 20))]
            toks[at:at + rng.randrange(1, 20)] = edit
        toks = toks[:len(toks) // BS * BS]
        hashes = list(range(h, h + len(toks) // BS))
        h += len(hashes)
        apply(m, store(hashes, toks=toks))
        if rng.random() < 0.3:
            base = toks or base
    assert any(answers) and 0 in answers


def test_a_batch_of_runs_counts_as_event_by_event() -> None:
    """Runs of removals (two media in turn), one-block lower-tier stores (one joined by hash,
    one only by its tokens) and a hash twice in one store: a batch at once and its events one
    by one leave the same counters."""
    def events() -> list:
        return [store([1, 2, 3], toks=tokens(1, 3)),
                store([1], parent=None, medium="CPU"), store([2], parent=1, medium="CPU"),
                store([77], parent=2, toks=tokens(40), medium="CPU"),
                store([4, 4], parent=3, toks=tokens(2, 2)),
                BlockRemoved(block_hashes=[1], medium="GPU"),
                BlockRemoved(block_hashes=[2, 99], medium="GPU"),
                BlockRemoved(block_hashes=[77], medium="CPU"),
                BlockRemoved(block_hashes=[4], medium=None),
                store([1, 2], toks=tokens(1, 2))]

    whole, single = TargetMirror(FleetContent("m")), TargetMirror(FleetContent("m"))
    apply(whole, *events(), ts=5.0)
    for event in events():
        apply(single, event, ts=5.0)
    a, b = whole.snapshot(), single.snapshot()
    assert a == b
    assert a.resident == {"GPU": 4, "CPU": 2}  # 3, a copy of 4, 1 and 2 again; 1, 2 on CPU
    assert a.errors == {"unknown_block": 1}
    assert a.loaded == {"CPU": 2 * BS}  # the host tier's 1 and 2 came back
    assert a.computed["eviction"] == 0


def test_a_copy_under_a_resident_hash_is_released_with_it() -> None:
    """A second store of a resident hash with other tokens is a copy of what that hash
    holds: removing both copies leaves nothing held, and raises nothing."""
    fleet = FleetContent("m")
    a, b = TargetMirror(fleet), TargetMirror(fleet)
    apply(a, store([1], toks=tokens(1)))
    apply(a, store([1], toks=tokens(2)))
    apply(a, BlockRemoved(block_hashes=[1, 1], medium="GPU"))
    assert a.snapshot().resident == {"GPU": 0} and a.snapshot().errors == {}
    apply(b, store([50], toks=tokens(2)))  # nobody holds it: not routing
    assert b.snapshot().computed["routing"] == 0


def test_what_a_replica_evicted_stays_bounded_by_the_tree() -> None:
    """Forgotten blocks leave the evicted sets: a stream of content never seen again, stored
    and removed, keeps them within the content cap."""
    m = TargetMirror(FleetContent("m", max_blocks=20))
    for i in range(40):
        apply(m, store([i], toks=tokens(100 + i)))
        apply(m, BlockRemoved(block_hashes=[i], medium="GPU"))
    assert len(m.fleet.blocks) <= 20
    assert len(m.copies.evicted) <= 20
    m.fleet.prune_evicted(m.copies.evicted)
    assert all(m.fleet.blocks.get(node.cid) is node for node in m.copies.evicted)


def test_one_removal_run_cuts_its_lifetimes_at_each_bucket() -> None:
    m = TargetMirror(FleetContent("m"))
    apply(m, store([1], toks=tokens(1)), ts=0.0)
    apply(m, store([2], toks=tokens(2)), ts=10.0)
    apply(m, store([3], toks=tokens(3)), ts=100.0)
    apply(m, BlockRemoved(block_hashes=[1, 2, 3], medium="GPU"), ts=200.0)  # 200, 190, 100 s
    buckets, total = m.snapshot().lifetimes["GPU"]
    assert total == 490.0
    assert dict(buckets)[60] == 0 and dict(buckets)[120] == 1 and dict(buckets)[300] == 3
    apply(m, store([4, 5], toks=tokens(4, 2)), ts=200.0)
    apply(m, BlockRemoved(block_hashes=[4, 5], medium="GPU"), ts=202.0)  # one bucket: 2 s
    buckets, total = m.snapshot().lifetimes["GPU"]
    assert total == 494.0 and dict(buckets)[1] == 0 and dict(buckets)[5] == 2


def test_a_removal_naming_no_block_changes_nothing_and_the_batch_goes_on() -> None:
    m = TargetMirror(FleetContent("m"))
    apply(m, store([1], toks=tokens(1)))
    apply(m, BlockRemoved(block_hashes=[], medium="GPU"), store([2], parent=1, toks=tokens(2)))
    snap = m.snapshot()
    assert snap.resident == {"GPU": 2} and snap.errors == {}
    assert snap.events["BlockRemoved"] == 1 and snap.events["BlockStored"] == 2


def test_a_block_keeps_its_children_only_past_the_first_and_forgetting_one_moves_back() -> None:
    """Three children of one block: its dict of them holds all three, the most recent is the
    one a path follows and the sibling a divergence is read against; forgetting them, newest
    first, moves the path back to the one before, and one child left needs no dict."""
    m = TargetMirror(FleetContent("m"))
    fleet = m.fleet
    apply(m, store([1], toks=tokens(1)))
    for h in (2, 3, 4):
        apply(m, store([h], parent=1, toks=tokens(h)))
    first, kids = m.copies.lookup(1), [m.copies.lookup(h) for h in (2, 3, 4)]
    assert first.last is kids[2] and list(fleet.kids[first].values()) == kids
    assert fleet.roots[None] not in fleet.kids  # one child: no dict
    assert m.take_divergences()[-1].theirs == tokens(3)  # 4 left the chain 3 made
    apply(m, BlockRemoved(block_hashes=[4, 3], medium="GPU"))
    fleet.max_blocks = 3  # forgets 3 (the oldest not held), then 4
    assert fleet.trim() == 1 and first.last is kids[2] and len(fleet.kids[first]) == 2
    fleet.max_blocks = 2
    assert fleet.trim() == 1 and first.last is kids[0] and first not in fleet.kids
    apply(m, store([5], parent=1, toks=tokens(5)))  # a divergence from 2, the one left
    assert m.take_divergences()[-1].theirs == tokens(2)


def test_a_removal_run_releases_one_copy_of_each_block_it_names() -> None:
    """Blocks with a host-tier copy, and one content held under two hashes: a removal run
    leaves each block held as long as a copy is left, whichever way the run is released."""
    fleet = FleetContent("m")
    a, b = TargetMirror(fleet), TargetMirror(fleet)
    apply(a, store([1, 2], toks=tokens(1, 2)), store([1], medium="CPU"),
          store([2], parent=1, medium="CPU"))
    apply(a, BlockRemoved(block_hashes=[1, 2], medium="GPU"))  # the CPU copies stay held
    apply(b, store([101, 102], toks=tokens(1, 2)))
    assert b.snapshot().computed["routing"] == 2 * BS
    apply(a, BlockRemoved(block_hashes=[1, 2], medium="CPU"))
    apply(b, store([103, 104], toks=tokens(1, 2)))  # a copy of b's own: nobody else holds it
    assert b.snapshot().computed["routing"] == 2 * BS
    apply(a, store([5], toks=tokens(7)), store([6], toks=tokens(7)))  # one content, twice
    apply(a, BlockRemoved(block_hashes=[5, 6, 5], medium="GPU"))  # 5 twice: one unknown
    assert a.snapshot().errors == {"unknown_block": 1}
    apply(b, store([107], toks=tokens(7)))
    assert b.snapshot().computed["routing"] == 2 * BS  # both copies went
    apply(a, store([8], toks=tokens(9)), store([9], toks=tokens(9)))
    apply(a, BlockRemoved(block_hashes=[8], medium="GPU"))
    apply(b, store([109], toks=tokens(9)))
    assert b.snapshot().computed["routing"] == 3 * BS  # one copy left


def test_a_dropped_tree_and_its_forgotten_blocks_are_freed_without_the_cyclic_collector() -> None:
    """Blocks are not tracked by the cyclic collector (a block's ``last`` and its child's
    ``parent`` are a cycle): a dropped fleet cuts them, and forgetting a block at the cap
    unlinks it, so with the collector off the memory of a mirror comes back once dropped."""
    import gc
    import tracemalloc

    def run(max_blocks: int) -> None:
        m = TargetMirror(FleetContent("m", max_blocks=max_blocks))
        for i in range(20):
            hashes = list(range(i * 100, i * 100 + 100))
            apply(m, store(hashes, toks=tokens(i, 100)))
            apply(m, BlockRemoved(block_hashes=hashes, medium="GPU"))

    gc.disable()
    tracemalloc.start()
    try:
        for max_blocks in (100_000, 300):  # every block kept; most forgotten at the cap
            run(max_blocks)  # (warm-up: first-call allocations)
            before = tracemalloc.get_traced_memory()[0]
            run(max_blocks)
            assert tracemalloc.get_traced_memory()[0] - before < 50_000  # 2,000 blocks: 300 kB
    finally:
        tracemalloc.stop()
        gc.enable()
