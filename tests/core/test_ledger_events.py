"""The event ledger (core/kv/eventledger.py) against vLLM's caching rule, request by request.

Each request has a prompt of ``p`` tokens of which ``hit`` full blocks are cached, and samples
``g`` tokens; vLLM stores every full block within its first ``p + g - 1`` tokens that it did
not hit (the last sampled token is never fed back), the answers' blocks included.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.core.kv.eventledger import EVENT_SHARES, event_counted, event_shares, event_table
from prefixwatch.core.vocab import exposition

BS = 16


def vllm(requests: list[tuple[int, int, int]]) -> dict[str, int]:
    """(p, hit blocks, g) per finished request -> the counters, the stream's stored tokens,
    and the truth: the prompt tokens in computed full blocks and in the prompts' tails."""
    out = dict.fromkeys(("prompt", "cached", "generated", "stored", "prompt_blocks",
                         "prompt_tails"), 0)
    for p, hit, g in requests:
        hit = min(hit, (p - 1) // BS)
        out["prompt"] += p
        out["cached"] += hit * BS
        out["generated"] += g
        out["stored"] += ((p + g - 1) // BS - hit) * BS
        out["prompt_blocks"] += (p // BS - hit) * BS
        out["prompt_tails"] += p % BS
    return out


def ledger(requests: list[tuple[int, int, int]], edges=(0, 0)) -> dict[str, int]:
    v = vllm(requests)
    return event_shares(v["prompt"], v["cached"], {"novel": v["stored"]}, len(requests), BS,
                        v["generated"] - len(requests), edges)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 400), st.integers(0, 30), st.integers(1, 200)),
                min_size=1, max_size=30))
def test_a_workload_with_answers_closes_to_the_token(requests) -> None:
    v = vllm(requests)
    got = ledger(requests)
    assert got["unexplained"] == 0, got
    assert got[exposition.LEDGER_OUTPUT] == v["generated"] - len(requests)
    assert sum(got[p] for p in EVENT_SHARES) == v["prompt"]
    assert all(got[p] >= 0 for p in EVENT_SHARES), got
    assert got[exposition.LEDGER_TAIL] <= (BS - 1) * len(requests)
    # Novel answers: what the prompts did not get from the cache, to the token.
    assert got["novel"] + got[exposition.LEDGER_TAIL] == v["prompt_blocks"] + v["prompt_tails"]


def test_one_token_answers_are_the_recordings_ledger() -> None:
    """max_tokens 1 (the vLLM 0.33 recordings): no output, the tail is the prompts' tails."""
    requests = [(2440, 0, 1), (2440, 150, 1), (61, 2, 1)]
    got = ledger(requests)
    assert got[exposition.LEDGER_OUTPUT] == 0 and got["unexplained"] == 0
    assert got[exposition.LEDGER_TAIL] == 2 * (2440 % BS) + 61 % BS
    assert got["novel"] == vllm(requests)["prompt_blocks"]


def test_an_answer_that_completes_the_prompts_last_block() -> None:
    # 40 prompt tokens (2 blocks + 8), 20 sampled: 59 tokens of KV, 3 full blocks stored; the
    # third holds 8 prompt and 8 answer tokens, the last 11 answer tokens stay partial.
    got = ledger([(40, 0, 20)])
    assert got[exposition.LEDGER_OUTPUT] == 19
    assert (got["novel"], got[exposition.LEDGER_TAIL], got["unexplained"]) == (29, 11, 0)
    assert got["novel"] + got[exposition.LEDGER_TAIL] == 40


def test_a_request_in_flight_at_an_edge_is_within_the_tail_not_unexplained() -> None:
    # At the span's end a request has 10 sampled tokens counted and one block stored past
    # its prompt's 2: the residual is within one block of the running request.
    p, g = 40, 10
    stored = ((p + g) // BS) * BS  # vLLM caches up to the token it feeds in this step
    got = event_shares(p, 0, {"novel": stored}, 0, BS, g, edges=(0, BS))
    assert got["unexplained"] == 0 and 0 <= got[exposition.LEDGER_TAIL] <= BS
    # A request that was running at the start, finishing in the span: stored more than its
    # counters moved by, within one block.
    got = event_shares(0, 0, {"novel": BS}, 1, BS, 6 - 1, edges=(BS, 0))
    assert got["unexplained"] == 0 and -BS <= got[exposition.LEDGER_TAIL] < 0
    # The same without the edge: unexplained.
    assert event_shares(0, 0, {"novel": BS}, 1, BS, 5)["unexplained"] < 0


def test_answers_repeating_held_content_come_out_of_the_other_parts() -> None:
    # Blocks the mirror classified routing (another replica held the same answer): the
    # output is taken from novel, then the tail, then routing; no part goes below 0.
    got = event_shares(32, 0, {"novel": 16, "routing": 48}, 1, BS, 40)
    assert all(got[p] >= 0 for p in EVENT_SHARES), got
    assert sum(got[p] for p in EVENT_SHARES) == 32 and got["unexplained"] == 0
    # Blocks missing from the stream (lost messages): what they held is unexplained.
    got = event_shares(32, 0, {"novel": 16}, 1, BS, 40)
    assert got["unexplained"] == 32 and sum(got[p] for p in EVENT_SHARES) == 32


def test_counters_keep_the_request_ledgers_identity_and_count_the_output() -> None:
    got = ledger([(300, 5, 50), (61, 0, 33)])
    counted = event_counted(got, 361)
    assert counted["prompt"] == sum(counted[p] for p in ("novel", "layout", "routing",
                                                         "eviction", "pool_reach"))
    assert counted[exposition.LEDGER_OUTPUT] == 50 + 33 - 2
    rows = event_table(got, 361)
    assert any(r.startswith("output ") for r in rows) and any(r.startswith("tail ")
                                                              for r in rows)
