"""SGLang's stream in the mirror: a page an event, chained by parent hash, is read as the
chains vLLM sends (one pass per chain), with every event still counted."""

from __future__ import annotations

from prefixwatch.core.kv.codec import Batch, BatchDecoder, SGLangBlockRemoved, page_runs
from prefixwatch.core.kv.codec import SGLangBlockStored as Stored
from prefixwatch.core.kv.mirror import FleetContent, TargetMirror
from prefixwatch.simulator.sglangevents import encode_sglang_batch


def pages(first: int, tokens: list[int], parent: int | None = None) -> list[Stored]:
    out = []
    for i, t in enumerate(tokens):
        out.append(Stored([first + i], parent, [t], 1, None, "GPU"))
        parent = first + i
    return out


def decoded(events: list) -> Batch:
    return BatchDecoder().decode(encode_sglang_batch(events, ts=1.0))


def test_chained_pages_are_one_chain_and_a_break_starts_another() -> None:
    events = decoded(pages(1, [10, 11, 12]) + pages(50, [20, 21])).events
    runs = list(page_runs(events))
    assert [(r.block_hashes, r.parent_block_hash, r.token_ids, n) for r, n in runs] == [
        ([1, 2, 3], None, [10, 11, 12], 3), ([50, 51], None, [20, 21], 2)]
    assert events[0].block_hashes == [1]  # the decoded events are left as they were


def test_the_mirror_reads_pages_as_it_reads_the_chain_and_counts_each_event() -> None:
    fleet = FleetContent("m")
    by_page, whole = TargetMirror(fleet), TargetMirror(FleetContent("m"))
    by_page.apply(decoded(pages(1, [10, 11, 12, 13])))
    whole.apply(decoded([Stored([1, 2, 3, 4], None, [10, 11, 12, 13], 1, None, "GPU")]))
    a, b = by_page.snapshot(), whole.snapshot()
    assert a.resident == b.resident == {"GPU": 4}
    assert a.computed == b.computed
    assert by_page.events["BlockStored"] == 4 and whole.events["BlockStored"] == 1
    by_page.apply(decoded([SGLangBlockRemoved([4], "GPU"), SGLangBlockRemoved([3], "GPU")]))
    assert by_page.snapshot().resident == {"GPU": 2}
    # A second replica storing the same content (SGLang's hashes are the same everywhere).
    other = TargetMirror(fleet)
    other.apply(decoded(pages(1, [10, 11, 12, 13])))
    assert other.snapshot().computed["routing"] == 2  # the two pages replica one still holds
