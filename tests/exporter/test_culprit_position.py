"""The culprit is named where the value that varies starts, whichever token two requests part
at: a timestamp parts in its seconds from a request a second older and in its minutes from one
a minute older, and both name the token where the timestamp starts. Through the real pieces:
the KV mirror (the blocks an event carries and the ones before them), the exporter's kind
namer, and the simulator's tokenizer."""

from __future__ import annotations

from prefixwatch.core.cache.whatvaries import one_token_reader, value_start
from prefixwatch.core.kv.codec import Batch, BlockStored
from prefixwatch.core.kv.mirror import FleetContent, TargetMirror
from prefixwatch.core.logs.builtin_tokenizer import Tokenizer, apply_chat_template
from prefixwatch.exporter.kvsubscriber.kinds import classify, culprit_position

BS = 16
TOKENIZER = Tokenizer()


def prompt(stamp: str) -> list[int]:
    text = apply_chat_template([
        {"role": "system", "content": f"Current date and time: {stamp}\nYou are a careful "
                                      "assistant. Answer briefly and cite the manual."},
        {"role": "user", "content": "How do I rotate the logs?"}])
    ids = TOKENIZER.encode_prompt(text)
    return ids[:len(ids) // BS * BS]


def stored(ids: list[int], shared_blocks: int, salt: int) -> BlockStored:
    """What vLLM publishes for a prompt whose first ``shared_blocks`` blocks were cached (the
    first prompt's, hashed 1000, 1001, ...): the blocks after them, under the last of them
    (hashes made up, ``salt`` thousands, one prompt's own)."""
    hashes = [salt * 1000 + i for i in range(shared_blocks, len(ids) // BS)]
    parent = 1000 + shared_blocks - 1 if shared_blocks else None
    return BlockStored(block_hashes=hashes, parent_block_hash=parent,
                       token_ids=ids[shared_blocks * BS:], block_size=BS, lora_id=None,
                       medium="GPU", lora_name=None, extra_keys=None)


def test_a_timestamp_is_named_where_it_starts_whichever_digit_parts() -> None:
    first = prompt("2026-12-03 09:21:17.123456")
    seconds_later = prompt("2026-12-03 09:21:18.654321")
    start = next(i for i, t in enumerate(first) if TOKENIZER.piece(t) == " 202")
    parts = next(i for i, (a, b) in enumerate(zip(first, seconds_later, strict=False)) if a != b)
    assert parts >= BS > start  # the value starts a block before the token where they part
    mirror = TargetMirror(FleetContent("m"))
    mirror.apply(Batch(0.0, [stored(first, 0, 1)]))
    mirror.apply(Batch(1.0, [stored(seconds_later, parts // BS, 2)]))
    minutes_later = prompt("2026-12-03 09:22:05.000001")
    mirror.apply(Batch(2.0, [stored(minutes_later, 1, 3)]))
    divergences = mirror.take_divergences()
    assert [d.position for d in divergences] == [parts, parts - 2]

    decode = TOKENIZER.decode
    piece = one_token_reader(lambda ids: decode(ids))
    named = [(classify(d, decode), culprit_position(d, classify(d, decode), piece))
             for d in divergences]
    assert named == [("date/time", start), ("date/time", start)]


def test_a_kind_that_names_no_value_is_where_the_prompts_part_and_an_unknown_start_no_vote(
        ) -> None:
    """Text names no value: its position is where the prompts part. Without a tokenizer, or
    when it fails, the value's start is not known: no position, so the divergence does not
    vote for the culprit (a busy tokenizer must not move it to 'token 20')."""
    first = prompt("2026-12-03 09:21:17.123456")
    mirror = TargetMirror(FleetContent("m"))
    mirror.apply(Batch(0.0, [stored(first, 0, 1)]))
    mirror.apply(Batch(1.0, [stored(prompt("2026-12-03 09:21:18.1"), 1, 2)]))
    (div,) = mirror.take_divergences()
    assert culprit_position(div, "date/time", None) is None
    assert culprit_position(div, "text", one_token_reader(TOKENIZER.decode)) == div.position

    def broken(_ids: list[int]) -> str:
        raise OSError("tokenizer gone")
    assert culprit_position(div, "date/time", one_token_reader(broken)) is None


def test_value_start_reads_back_over_the_value_only() -> None:
    def back(kind: str, pieces: list[str]) -> int:
        return value_start(kind, range(len(pieces)), pieces.__getitem__)

    pieces = ["\n\n", "Current", " date", " and", " time", ":", " 202", "6", "-", "12", "-",
              "03", " 09", ":", "21", ":"]
    assert back("date/time", pieces) == 10  # from ' 202'; the ':' before is not it
    assert back("date/time", ["Now", ":", " ", "Dec", " 3", ",", " "]) == 4
    assert back("id", ["(", "user", " id", " 3", "f", "2", "a"]) == 4
    assert back("number", ["Order", " 12", ",", "345"]) == 3
    assert back("text", ["a", "b"]) == 0
    assert back("date/time", ["line\n", "12"]) == 1  # never across a line break


def test_where_own_content_starts_is_named_without_a_tokenizer() -> None:
    from prefixwatch.core.kv.counts import Divergence

    late = Divergence(900, [1, 2], [3], [4], chain_tokens=1000)
    assert classify(late, None) == "own content"  # 90% of the prompt shared: no call made
    assert classify(Divergence(10, [1], [3], [4], chain_tokens=1000), None) == "unknown"


def test_a_slow_tokenizer_names_the_newest_divergences_and_counts_the_rest_unknown() -> None:
    """One round names a target's newest divergences for NAME_SECONDS at most: with a
    tokenizer that takes 0.1 s a call, the round ends in time, the newest are named and the
    older ones of the round are 'unknown' (counted, never waiting for the next round)."""
    import threading
    import time

    from prefixwatch.exporter.kvsubscriber import kinds

    first = prompt("2026-12-03 09:21:17.123456")
    mirror = TargetMirror(FleetContent("m"))
    mirror.apply(Batch(0.0, [stored(first, 0, 1)]))
    for i in range(2, 22):
        mirror.apply(Batch(float(i), [stored(prompt(f"2026-12-03 09:21:{i:02d}.1"), 1, i)]))
    pending = mirror.take_divergences()
    assert len(pending) == 20

    def slow(ids: list[int]) -> str:
        time.sleep(0.1)
        return TOKENIZER.decode(ids)

    namer = kinds.KindNamer({}, {}, threading.Event())
    began = time.monotonic()
    named = namer._name(pending, slow, one_token_reader(slow))
    took = time.monotonic() - began
    assert took < kinds.NAME_SECONDS + 2.0  # one divergence's calls past the budget at most
    said = [kind for _div, kind, _at in named]
    assert said[0] == "date/time" and said[-1] == "unknown"  # the newest first
    assert named[0][0] is pending[-1]
    assert 0 < said.count("date/time") < 20 and said.count("unknown") == 20 - said.count(
        "date/time")
