"""The ledger: hand-computed small logs (block size 4), and the identity on random ones."""

from __future__ import annotations

from array import array

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.core.cache.blockcache import cached_tokens_for
from prefixwatch.core.cache.prefixindex import PrefixIndex
from prefixwatch.core.cache.requestledger import Ledger, Parts, ratios, shares

BS = 4


def feed(requests, pools=None, window=None, cached=None):
    """(tokens, replica) in order -> the Parts of each request."""
    index = PrefixIndex(BS, window or 1000)
    ledger = Ledger(BS, (pools or {}).get)
    out = []
    for i, (tokens, replica) in enumerate(requests):
        q = array("I", tokens)
        entry, div = index.add_timed(q, None, float(i + 1))
        out.append(ledger.account(index, q, None, entry, div, replica,
                                  None if cached is None else cached[i]))
    return ledger, out


def test_first_request_is_novel_and_a_shared_prefix_is_reach() -> None:
    ledger, (a, b) = feed([(list(range(1, 13)), None),
                           ([*range(1, 9), 20, 21, 22, 23], None)])
    assert (a.prompt, a.novel, a.pool_reach) == (12, 12, 0)
    # 8 shared tokens = 2 full blocks; the rest (4 tokens) is too short for a layout run.
    assert (b.prompt, b.novel, b.layout, b.routing, b.eviction, b.pool_reach) == (
        12, 4, 0, 0, 0, 8)
    assert ledger.unmeasured() == ("routing", "eviction")


def test_a_one_token_span_at_the_top_is_layout() -> None:
    shared = list(range(1, 12))  # tokens 1..11 after the varying first token
    _, (_, b) = feed([([100, *shared, 50, 51, 52, 53], None),
                      ([101, *shared, 60, 61, 62, 63], None)])
    # Diverges at 0; after one token both agree for 11 tokens (to position 12): 3 blocks.
    assert (b.novel, b.layout, b.pool_reach) == (4, 12, 0)


def test_a_span_longer_than_64_tokens_is_not_layout() -> None:
    tail = list(range(1, 20))
    a = [*range(1000, 1070), *tail]
    b = [*range(2000, 2070), *tail]
    _, (_, pb) = feed([(a, None), (b, None)])
    assert (pb.layout, pb.novel) == (0, len(b))


def test_routing_is_reach_on_another_replica() -> None:
    p = list(range(1, 10))  # 9 tokens: 2 cacheable blocks
    ledger, (_, b, c) = feed([(p, "A"), (p, "B"), (p, "A")])
    assert (b.routing, b.pool_reach, b.novel) == (8, 0, 1)
    assert (c.routing, c.pool_reach, c.novel) == (0, 8, 1)
    assert ledger.unmeasured() == ("eviction",)


def test_eviction_is_reach_the_pool_lost() -> None:
    p, other = list(range(1, 10)), list(range(30, 39))
    # 4 blocks, one the null block: another 9-token prompt reuses all three.
    ledger, (_, _, c) = feed([(p, "A"), (other, "A"), (p, "A")], pools={"A": 4})
    assert (c.routing, c.eviction, c.pool_reach, c.novel) == (0, 8, 0, 1)
    ledger, (_, _, c) = feed([(p, "A"), (other, "A"), (p, "A")], pools={"A": 8})
    assert (c.eviction, c.pool_reach) == (0, 8)
    assert ledger.unmeasured() == ()


def test_shares_close_with_achieved_and_sum_to_one() -> None:
    p = list(range(1, 10))
    ledger, parts = feed([(p, "A"), (p, "B"), (p, "A")], pools={"A": 8, "B": 8},
                         cached=[0, 0, 4])
    total = ledger.window(0.0)
    assert total.achieved == 4
    assert shares(total) == {"achieved": 4, "novel": 11, "layout": 0, "routing": 8,
                             "eviction": 0, "unexplained": 4}
    assert sum(shares(total).values()) == total.prompt == 27
    assert abs(sum(ratios(total).values()) - 1.0) < 1e-12
    assert ledger.window(3.0).prompt == 9 and ledger.window(3.0).achieved == 4
    # The engine's counters over the window override the log's own figure.
    assert shares(total, achieved=8)["unexplained"] == 0


def test_achieved_unknown_when_one_request_lacks_it() -> None:
    total = Parts()
    total += Parts(10, 10, 0, 0, 0, 0, 3, 1)
    total += Parts(10, 10, 0, 0, 0, 0, None, 1)
    assert total.achieved is None and total.prompt == 20


def test_replica_windows_follow_the_fleet_window() -> None:
    p = list(range(1, 10))
    ledger, (_, _, c) = feed([(p, "A"), (list(range(40, 49)), "B"), (p, "A")], window=1)
    # The fleet window holds 1 request: A's first one left it, and A's index with it.
    assert (c.routing, c.pool_reach, c.novel) == (0, 0, 9)
    assert sum(len(ix.window) for ix in ledger.replicas.values()) == 1


def _lcp(a, b) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=30),
                          st.sampled_from(["A", "B", "C", None])), min_size=1, max_size=40),
       st.integers(1, 8), st.sampled_from([None, 3, 6, 40]))
def test_identity_and_reaches_against_brute_force(reqs, window, pool) -> None:
    known = [(t, r if r is not None else "A") for t, r in reqs]
    pools = {"A": pool, "B": pool, "C": pool} if pool else {}
    ledger, parts = feed(known, pools=pools, window=window)
    for i, ((tokens, replica), got) in enumerate(zip(known, parts, strict=True)):
        got.check()
        earlier = known[max(0, i - window):i]  # the window before this request
        fleet = max((_lcp(tokens, t) for t, _ in earlier), default=0)
        own = max((_lcp(tokens, t) for t, r in earlier if r == replica), default=0)
        assert got.prompt - got.novel - got.layout == cached_tokens_for(
            len(tokens), fleet // BS, BS)
        assert got.prompt - got.novel - got.layout - got.routing == cached_tokens_for(
            len(tokens), own // BS, BS)
    ledger.totals.check()
    assert ledger.totals.prompt == sum(len(t) for t, _ in known)
    recent = ledger.window(0.0)  # the requests still in the window
    recent.check()
    assert recent.prompt == sum(len(t) for t, _ in known[-window:])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=25))
def test_audit_lists_and_window_arrays_give_the_same_ledger(reqs) -> None:
    """The audit's index (list edges, list queries) and a window that drops nothing (array
    edges) are the same trie: every request's parts, layout included, must agree."""
    _, packed = feed([(t, None) for t in reqs])
    index, ledger = PrefixIndex(BS), Ledger(BS)
    for tokens, want in zip(reqs, packed, strict=True):
        q = list(tokens)
        result = index.add(q)
        assert ledger.account(index, q, None, result, result.divergence) == want
