"""The request-level view: vLLM log lines, the sliding window, and the reader (tail -F)."""

from __future__ import annotations

import io
import json
import os
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.core.cache.prefixindex import PrefixIndex
from prefixwatch.core.logs.formats import BadLine, LogRequest, VllmLogJoiner, parse_line, read_jsonl
from prefixwatch.exporter.requestlog.reader import (
    MAX_LINE_BYTES,
    RequestsLogConfig,
    RequestsLogReader,
)
from prefixwatch.exporter.requestlog.view import RequestView, new_window
from prefixwatch.simulator.requestlog import RequestLogger

# What vLLM 0.33 writes (request_logger.py), with the process prefix of a multi-process server.
DETAILS = ("(APIServer pid=412) DEBUG 11-30 06:11:52 [request_logger.py:47] Request "
           "cmpl-9f2c details: prompt: '<|begin_of_text|>Hi, it\\'s me', "
           "prompt_token_ids: [128000, 13347, 11, 433, 596, 757], prompt_embeds shape: None.")
RECEIVED = ("(APIServer pid=412) INFO 11-30 06:11:52 [request_logger.py:57] Received request "
            "cmpl-9f2c: params: SamplingParams(n=1, temperature=0.7), lora_request: "
            "LoRARequest(lora_name='sql-adapter', lora_int_id=1, lora_path='/a').")
# vLLM 0.6 to 0.9: one INFO line.
OLD = ("INFO 05-02 10:00:00 logger.py:39] Received request chatcmpl-1: prompt: 'x', params: "
       "SamplingParams(n=1), prompt_token_ids: [1, 2, 3], prompt_embeds shape: None, "
       "lora_request: None, prompt_adapter_request: None.")


def feed(lines: list[str], max_log_len: int | None = None) -> list[LogRequest | BadLine | None]:
    joiner = VllmLogJoiner(max_log_len)
    out: list[LogRequest | BadLine | None] = []
    for i, line in enumerate(lines):
        found = parse_line(line, f"log:{i + 1}", joiner)
        out.extend(found if found is not None else [None])
    out.extend(joiner.flush())
    return out


def test_vllm_033_lines_join_the_lora_adapter() -> None:
    out = feed([DETAILS, RECEIVED])
    requests = [r for r in out if isinstance(r, LogRequest)]
    assert len(requests) == 1
    assert list(requests[0].token_ids) == [128000, 13347, 11, 433, 596, 757]
    assert requests[0].lora == "sql-adapter" and requests[0].extra_keys == ("sql-adapter", None)
    assert not requests[0].truncated


def test_details_without_its_info_line_still_counts() -> None:
    out = feed([DETAILS])
    assert [list(r.token_ids) for r in out if isinstance(r, LogRequest)] == [
        [128000, 13347, 11, 433, 596, 757]]


def test_old_single_line_form() -> None:
    (req,) = feed([OLD])
    assert isinstance(req, LogRequest) and list(req.token_ids) == [1, 2, 3] and req.lora is None


def test_cut_at_max_log_len_is_marked_truncated() -> None:
    (req,) = [r for r in feed([DETAILS], max_log_len=6) if r is not None]
    assert isinstance(req, LogRequest) and req.truncated


@pytest.mark.parametrize("line, reason", [
    (DETAILS[:DETAILS.index("757")], "not closed"),  # a partial line
    (DETAILS.replace("[128000, 13347, 11, 433, 596, 757]", "None"), "no prompt token ids"),
    (DETAILS.replace("13347", "x13"), "other than token ids"),
    ('{"messages": "hi"}', "messages must be"),
    ('{"prompt": "cut', "not JSON"),
])
def test_bad_lines_are_reported(line: str, reason: str) -> None:
    out = [r for r in feed([line]) if r is not None]
    assert len(out) == 1 and isinstance(out[0], BadLine) and reason in out[0].reason


def test_other_vllm_output_is_not_a_request() -> None:
    assert feed(["INFO 11-30 06:11:50 [loggers.py:123] Engine 000: Avg prompt throughput: 1.0",
                 ""]) == [None, None]


def test_simulator_lines_parse_back(tmp_path) -> None:
    buf = io.StringIO()
    logger = RequestLogger(buf)
    logger.log("cmpl-1", "hello", [5, 6, 7], ("adapter-a", None))
    logger.log("cmpl-2", "it's", [5, 6, 8], None)
    path = tmp_path / "vllm.log"
    path.write_text(buf.getvalue() + "WARNING 11-30 06:00:00 [x.py:1] unrelated\n")
    got = list(read_jsonl([str(path)]))
    assert [(list(r.token_ids), r.lora) for r in got if isinstance(r, LogRequest)] == [
        ([5, 6, 7], "adapter-a"), ([5, 6, 8], None)]
    assert not [r for r in got if isinstance(r, BadLine)]


# -- the sliding index -------------------------------------------------------------------------

prompts = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(prompts, st.integers(1, 8))
def test_sliding_index_matches_the_audit_index_when_nothing_leaves(batch, block_size) -> None:
    full = PrefixIndex(block_size)
    sliding = new_window(block_size, max_requests=10_000, max_blocks=10_000)
    for tokens in batch:
        expected = full.add(tokens)
        entry, divergence = sliding.add_timed(tokens)
        assert entry.cacheable_tokens == expected.cacheable_tokens
        assert (divergence.position if divergence else None) == (
            expected.divergence.position if expected.divergence else None)


@settings(max_examples=100, deadline=None)
@given(prompts, st.integers(1, 6), st.integers(1, 5))
def test_sliding_index_equals_a_fresh_index_of_the_window(batch, block_size, keep) -> None:
    """With a window of `keep` requests, a request's cacheable tokens are what an index of
    just the requests before it in the window would give."""
    sliding = new_window(block_size, max_requests=keep, max_blocks=10_000)
    for i, tokens in enumerate(batch):
        reference = PrefixIndex(block_size)
        for earlier in batch[max(0, i - keep):i]:
            reference.add(earlier)
        entry, _ = sliding.add_timed(tokens)
        assert entry.cacheable_tokens == reference.add(tokens).cacheable_tokens


def test_memory_is_bounded_by_the_window() -> None:
    rng = random.Random(3)
    index = new_window(16, max_requests=50, max_blocks=2_000)
    for _ in range(2_000):
        index.add_timed([rng.randrange(50_000) for _ in range(rng.randrange(1, 400))])
        assert len(index.window) <= 50 and index.blocks <= 2_000 + 400 // 16 + 1
    while index.window:
        index.drop_oldest()
    assert index.blocks == 0 and not index.roots


def test_view_window_and_histogram() -> None:
    now = [1000.0]
    view = RequestView(block_size=4, clock=lambda: now[0])
    system = list(range(100, 140))
    for i in range(30):
        view.add(system + [i, i, i, i, i])
    now[0] += 100
    view.add([7] * 30)
    recent, _ = view.evidence(10.0)
    assert recent.requests == 1 and recent.achievable == 0.0
    earlier, kinds = view.evidence(1000.0)
    assert earlier.requests == 31 and 0.7 < earlier.achievable < 0.9
    assert kinds == {"unknown": 30}  # no decoder: the kind is not guessed
    buckets, total = view.histogram()
    # 29 requests diverge after the shared 40 tokens, the last one at its first token.
    assert dict(buckets)["16.0"] == 1 and dict(buckets)["64.0"] == 30 and total == 29 * 40


# -- the reader ----------------------------------------------------------------------------------


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def line(tokens: list[int]) -> str:
    return json.dumps({"prompt_token_ids": tokens}) + "\n"


def test_follow_partial_lines_rotation_truncation_and_long_lines(tmp_path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text(line([1] * 40) * 5)  # history: warms the window, not counted
    view = RequestView(block_size=16)
    reader = RequestsLogReader(RequestsLogConfig(str(path), follow=True, tokenizer="none"),
                               view, poll_seconds=0.05)
    reader.start()
    try:
        wait_for(lambda: view.window_size()[0] == 5)
        assert view.lines["request"] == 0
        with open(path, "a") as fh:
            whole = line([1] * 40)
            fh.write(whole[:10])  # a writer in the middle of a line
            fh.flush()
            time.sleep(0.3)
            assert view.lines["request"] == 0 and view.lines["skipped"] == 0
            fh.write(whole[10:])
            fh.write("not json at all\n")
            fh.write('{"prompt_token_ids": [1, 2, "x"]}\n')
            fh.write("x" * (MAX_LINE_BYTES + 10) + "\n")
            fh.write(line([2] * 40))
        wait_for(lambda: view.lines["request"] == 2)
        wait_for(lambda: view.lines["skipped"] == 2)
        assert view.lines["other"] == 1  # the plain text line
        ev, _ = view.evidence(60)
        assert ev.requests == 2 and ev.cacheable_tokens == 32  # the first one hit the history
        os.rename(path, tmp_path / "requests.jsonl.1")  # logrotate
        path.write_text(line([3] * 40))
        wait_for(lambda: view.lines["request"] == 3)
        path.write_text("")  # truncated in place (copytruncate)
        time.sleep(0.3)
        path.write_text(line([4] * 40))
        wait_for(lambda: view.lines["request"] == 4)
    finally:
        reader.stop()


def test_read_once_counts_and_skips_bad_lines(tmp_path) -> None:
    path = tmp_path / "mixed.log"
    path.write_bytes(b"".join([
        line([5] * 20).encode(), b"\xff\xfe garbage\n", b'{"messages": []}\n',
        DETAILS.encode() + b"\n", RECEIVED.encode() + b"\n", line([5] * 20).encode()[:-9]]))
    view = RequestView(block_size=16)
    reader = RequestsLogReader(RequestsLogConfig(str(path), tokenizer="none"), view)
    reader.start()
    assert reader.done.wait(10)
    reader.stop()
    assert view.lines == {"request": 2, "truncated": 0, "skipped": 2, "other": 2}


def test_text_requests_without_a_tokenizer_are_skipped_not_fatal(tmp_path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    view = RequestView()
    reader = RequestsLogReader(RequestsLogConfig(str(path), tokenizer="server"), view,
                               first_target="http://127.0.0.1:9/metrics")
    reader.start()
    assert reader.done.wait(20)
    reader.stop()
    assert view.lines["skipped"] == 1 and view.lines["request"] == 0
