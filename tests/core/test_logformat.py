"""Request log lines: simdjson's pass accepts exactly what the strict decoder accepts, with the
same values, and leaves every refusal (and its reason) to it."""

from __future__ import annotations

import json
import subprocess
import sys
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.core.logs import jsonline, strictline
from prefixwatch.core.logs.formats import BadLine, read_jsonl
from prefixwatch.core.logs.tokenids import json_ids


def outcome(decode, text: str | bytes) -> tuple:
    """What a decoder makes of a line: the request's fields, or the reason it gives."""
    try:
        req = decode(text, "log:1")
    except ValueError as exc:
        return ("refused", str(exc))
    ids = None if req.token_ids is None else list(req.token_ids)
    return ("request", ids, req.prompt, req.messages, req.tools, req.lora, req.cache_salt,
            req.replica, req.cached_tokens, req.max_tokens, type(req.token_ids).__name__)


def took_the_pass(text: str | bytes) -> bool:
    return jsonline._fast(text, "log:1") is not None


#: Token ids as JSON text: good ones (with the 32-bit edge and -0), and the awkward ones:
#: 64-bit edges, negatives, booleans, floats, exponents, strings, null, nested lists, objects.
GOOD_ID = st.one_of(st.integers(0, 200_000).map(str),
                    st.sampled_from(["0", "-0", "4294967295", "255", "256"]))
BAD_ID = st.sampled_from(["4294967296", "18446744073709551615", "18446744073709551616", "-1",
                          "-3", "true", "false", "null", "2.0", "1e3", "1E2", '"7"', "[7]", "[]",
                          "{}", '{"a": 1}', "0.5", "99999999999999999999", "01"])


@st.composite
def id_lists(draw) -> str:
    items = draw(st.lists(GOOD_ID, max_size=40))
    if draw(st.integers(0, 3)) == 0:  # a quarter of the lists hold one awkward element
        items.insert(draw(st.integers(0, len(items))), draw(BAD_ID))
    return "[" + draw(st.sampled_from([", ", ","])).join(items) + "]"


GOOD_VALUES = st.sampled_from(['"a"', '"t1"', "null", "7", "0", '"a[b"', '"\\u00e9"', '"x{"'])
BAD_VALUES = st.one_of(
    st.sampled_from(["-1", "true", "2.0", '{"x": 1}', '"\\ud800"', "[]", "[1]", "4294967296",
                     '"\\x"']),
    st.text(max_size=8).map(json.dumps),
)
USAGES = st.sampled_from([
    '{"prompt_tokens_details": {"cached_tokens": 32}}', '{"prompt_tokens_details": {}}',
    '{"prompt_tokens_details": {"cached_tokens": -1}}', '{"prompt_tokens_details": null}',
    '{"prompt_tokens_details": {"cached_tokens": true}}', '{"total_tokens": 5}', "null", "3",
    '{"prompt_tokens_details": {"cached_tokens": 1, "cached_tokens": 16}}',
])
KEYS = ["prompt", "messages", "tools", "lora", "cache_salt", "replica", "cached_tokens",
        "max_tokens", "usage", "request_id", "extra"]


@st.composite
def lines(draw) -> str:
    """A JSON object line (or a near one) of the fields a request log may hold, in any
    order, a key possibly repeated, with odd spacing; most of them good lines."""
    keys = draw(st.lists(st.sampled_from(KEYS), max_size=4))
    if draw(st.integers(0, 4)):
        keys.insert(draw(st.integers(0, len(keys))), "prompt_token_ids")
    if draw(st.integers(0, 9)) == 0:
        keys.append(draw(st.sampled_from(keys or ["prompt_token_ids"])))  # a repeated key
    parts = []
    for key in keys:
        bad = draw(st.integers(0, 5)) == 0
        if key in ("prompt_token_ids", "prompt"):
            value = draw(BAD_VALUES if bad else id_lists())
        elif key == "usage":
            value = draw(USAGES)
        elif key == "messages":
            value = draw(st.sampled_from(['[{"role": "user", "content": "hi"}]', '"hi"', "[]"]))
        elif key in ("cached_tokens", "max_tokens") and not bad:
            value = draw(st.sampled_from(["0", "16", "null"]))
        else:
            value = draw(BAD_VALUES if bad else GOOD_VALUES)
        space = draw(st.sampled_from(["", " ", "\t"]))
        parts.append(f'"{key}"{space}:{space}{value}')
    ending = draw(st.sampled_from(["", "\n", " \n", "\r\n", "\n", "", " x", "]"]))
    return "{" + draw(st.sampled_from([", ", ","])).join(parts) + "}" + ending


@settings(max_examples=800, deadline=None)
@given(lines(), st.booleans())
def test_the_pass_agrees_with_the_strict_decoder(line: str, as_bytes: bool) -> None:
    text = line.encode() if as_bytes else line
    assert outcome(jsonline.decode_request, text) == outcome(strictline.decode_request, text)


@pytest.mark.parametrize("line", [
    '{"prompt_token_ids": [1, 2, 3]}\n',
    '{"request_id": "r1", "prompt_token_ids": [1, 2, 3], "replica": "a", "max_tokens": 16}',
    '{"prompt_token_ids": [1, 2], "lora": "ad", "cache_salt": "s", "cached_tokens": 0}',
    '{"prompt_token_ids": [1, 2], "usage": {"prompt_tokens_details": {"cached_tokens": 16}}}',
    '{"prompt": [4294967295, 0]}',
    '{"prompt_token_ids": [-0, 7]}',
])
def test_pre_tokenized_lines_take_the_pass(line: str) -> None:
    """The common shapes (ids alone, a gateway's fleet log, usage) never reach msgspec."""
    assert took_the_pass(line.encode()) and took_the_pass(line)
    assert outcome(jsonline.decode_request, line) == outcome(strictline.decode_request, line)


@pytest.mark.parametrize("line", [
    '{"prompt_token_ids": [1, [2]]}', '{"prompt_token_ids": [[1], [2]]}',  # simdjson flattens
    '{"prompt_token_ids": [1, 4294967296]}', '{"prompt_token_ids": [1, -2]}',
    '{"prompt_token_ids": [1, true]}', '{"prompt_token_ids": [1, 2.0]}',
    '{"prompt_token_ids": []}', '{"prompt_token_ids": [1], "prompt_token_ids": [2]}',
    '{"prompt_token_ids": [1], "prompt": 5}', '{"prompt_token_ids": [1], "lora": 7}',
    '{"prompt_token_ids": [1], "usage": {"prompt_tokens_details": {"cached_tokens": -1}}}',
    '{"messages": [{"role": "user", "content": "hi"}]}', '[1, 2]', '{"prompt_token_ids": [1]} x',
])
def test_lines_the_pass_leaves_to_the_strict_decoder(line: str) -> None:
    assert not took_the_pass(line.encode())
    assert outcome(jsonline.decode_request, line) == outcome(strictline.decode_request, line)


@pytest.mark.parametrize("depth", [100, jsonline.MAX_OBJECTS + 10, 1010, 5000])
def test_deep_lines_are_skipped_lines_not_errors(depth: int, tmp_path) -> None:
    """Nesting past the interpreter's limit is a reason, never a RecursionError; the pass
    leaves a line of many braces to the strict decoder, whose limit decides."""
    line = ('{"prompt_token_ids": [1, 2], "x": ' + '{"a": ' * depth + "1" + "}" * depth
            + "}")
    got = outcome(jsonline.decode_request, line.encode())
    assert got == outcome(strictline.decode_request, line.encode())
    assert took_the_pass(line.encode()) == (depth + 1 <= jsonline.MAX_OBJECTS)
    if depth >= 1010:
        assert got == ("refused", "not JSON (nested too deeply)")
        log = tmp_path / "deep.jsonl"
        log.write_text(line + "\n" + json.dumps({"prompt_token_ids": [1, 2]}) + "\n")
        bad, good = read_jsonl([str(log)])
        assert isinstance(bad, BadLine) and bad.where == f"{log}:1"
        assert list(good.token_ids) == [1, 2]


def test_ids_come_packed() -> None:
    req = jsonline.decode_request(b'{"prompt_token_ids": [5, 4294967295, 0]}', "log:1")
    assert isinstance(req.token_ids, array) and req.token_ids.typecode == "I"
    assert list(req.token_ids) == [5, 4294967295, 0]


@pytest.mark.parametrize("text, ids", [
    ("[1, 2, 3]", [1, 2, 3]), ("[]", []), ("[4294967295]", [4294967295]),
    ("[4294967296]", None), ("[1, -2]", None), ("[1, [2]]", None), ("[1, true]", None),
    ("[1, 2", None), ("1, 2]", None),
])
def test_json_ids(text: str, ids: list[int] | None) -> None:
    got = json_ids(text.encode())
    assert (None if got is None else list(got)) == ids


def test_the_strict_decoder_knows_every_field_the_pass_reads() -> None:
    read = {jsonline.IDS, "prompt", "messages", "tools"} | jsonline.OTHER_FIELDS
    assert read == strictline.FIELD_NAMES


def test_a_pre_tokenized_log_is_read_without_msgspec(tmp_path) -> None:
    """msgspec (the strict decoder) is imported only for a line the pass leaves to it."""
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"prompt_token_ids": [1, 2, 3]}) + "\n"
                   + json.dumps({"prompt_token_ids": [1, 2], "replica": "a"}) + "\n")
    code = ("import sys; from prefixwatch.core.logs.formats import read_jsonl; "
            f"n = len(list(read_jsonl([{str(log)!r}]))); "
            "print(n, 'prefixwatch.core.logs.strictline' in sys.modules, 'msgspec' in sys.modules)")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=60)
    assert plain.stdout.split() == ["2", "True", "True"]  # the replica is checked by msgspec
    log.write_text(json.dumps({"prompt_token_ids": [1, 2, 3]}) + "\n")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=60)
    assert plain.stdout.split() == ["1", "False", "False"]


def test_a_held_document_costs_one_line_the_pass_not_the_answer() -> None:
    """The parser is reused; while a document of it is still held, that line goes to the
    strict decoder (same answer) and the thread gets a new parser."""
    from prefixwatch.core.logs import tokenids

    held = tokenids.parse(b'{"a": 1}')
    line = b'{"prompt_token_ids": [1, 2, 3]}'
    assert not took_the_pass(line)
    assert outcome(jsonline.decode_request, line) == outcome(strictline.decode_request, line)
    assert took_the_pass(line)
    del held


def test_threads_read_with_parsers_of_their_own() -> None:
    from concurrent.futures import ThreadPoolExecutor

    lines = [json.dumps({"prompt_token_ids": list(range(i, i + 300))}).encode()
             for i in range(400)]

    def decode(line: bytes) -> list[int]:
        return list(jsonline.decode_request(line, "log:1").token_ids)

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(decode, lines * 3))
    assert got == [list(range(i, i + 300)) for i in range(400)] * 3
