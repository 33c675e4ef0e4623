"""SGLang's stream in the mirror: a page an event, chained by parent hash, is read as the
chains vLLM sends (one pass per chain), with every event still counted."""

from __future__ import annotations

import pytest

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


class _Frames:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def publish(self, events: list) -> None:
        self.payloads.append(encode_sglang_batch(events))

    def restart(self) -> None:
        pass


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("host", [0, 400])
def test_the_ledger_closes_under_eviction_and_hicache(page_size: int, host: int) -> None:
    """A small pool (evictions), repeated prompts, requests admitted together, answers of
    every length, with and without the HiCache host pool: to the token."""
    import random

    from prefixwatch.core.kv.eventledger import event_shares
    from prefixwatch.core.vocab import exposition
    from prefixwatch.simulator.engine import EngineConfig, VirtualClock
    from prefixwatch.simulator.kvpublisher import KVEvents
    from prefixwatch.simulator.sglangengine import SGLangEngine
    from prefixwatch.simulator.sglangevents import SGLangEventSink

    engine = SGLangEngine(EngineConfig(num_blocks=40, page_size=page_size,
                                       offload_blocks=host), VirtualClock())
    frames = _Frames()
    engine.attach_kv_events(KVEvents(SGLangEventSink(), frames))
    rng = random.Random(3)
    system = [5000 + j for j in range(300)]
    sent = []
    for k in range(40):
        prompt = system[:rng.randint(100, 300)] + [rng.randrange(9000, 9100)
                                                   for _ in range(rng.randint(1, 80))]
        if k % 7 == 0 and sent:
            prompt = list(sent[-1].prompt)  # the same prompt again: its answer too
        sent.append(engine.submit(prompt, rng.randint(1, 40)))
        if k % 3:
            engine.run_until_idle()
    engine.run_until_idle()
    mirror = TargetMirror(FleetContent("m"))
    for payload in frames.payloads:
        mirror.apply(BatchDecoder().decode(payload))
    assert engine.cache.evicted_tokens > 0
    prompt = sum(len(r.prompt) for r in sent)
    got = event_shares(prompt, sum(r.cached_tokens for r in sent), mirror.snapshot().computed,
                       len(sent), mirror.block_size, sum(len(r.output) - 1 for r in sent),
                       engine="sglang")
    assert got["unexplained"] == 0, got
    assert sum(got[p] for p in exposition.KV_LEDGER_SHARES) == prompt
    assert all(got[p] >= 0 for p in exposition.KV_LEDGER_SHARES), got
