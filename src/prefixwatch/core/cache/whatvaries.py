"""What varies where two prompts diverge (a date, an id, key order, ...) and its fix.

Every request of a healthy log diverges somewhere too: where its own content (the user's
question) starts, after the shared prefix. That is not a problem to fix, so a divergence
after ``OWN_CONTENT_SHARE`` of the prompt (the alert threshold: the shared prefix alone
already serves the request above it) is reported as ``own content``, whatever its text
looks like ("Question 17" is a number, but not one to move).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

from prefixwatch.core.vocab.exposition import DEFAULT_HIT_RATIO_THRESHOLD

OWN_CONTENT = "own content"
UNDECODED = "token ids"
#: A divergence at or after this share of the prompt is where the request's own content
#: starts: the prefix before it already serves the request above the alert threshold.
OWN_CONTENT_SHARE = DEFAULT_HIT_RATIO_THRESHOLD

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}(:\d{2})?|\b(19|20)\d{2}\b|"
                   r"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\b|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|"
                   r"Aug|Sep|Oct|Nov|Dec)[a-z]*\b", re.I)
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}|[0-9a-f]{12,}|\b[0-9a-f]{6,}\b", re.I)
_KEY = re.compile(r'"([^"\\]{1,64})"\s*:')
_NAME = re.compile(r"\b[A-Z][a-z]+ [A-Z][a-z]+\b")

FIXES = {
    "date/time": "Move the date or time out of the prefix: put it in the user turn or a last "
                 "system line, or round it (a date, not a timestamp); check the chat template "
                 "does not inject today's date.",
    "id": "Remove request, trace or user ids from the prompt, or move them to the end; pass "
          "them as metadata instead.",
    "key order": "Serialise tools and JSON with a fixed key and tool order "
                 "(json.dumps(..., sort_keys=True), tools sorted by name).",
    "number": "A number changes near the top (a counter, a price, an order number): move it "
              "after the stable instructions.",
    "name": "A user or customer name in the prefix: move personalisation after the shared "
            "instructions.",
    OWN_CONTENT: "Nothing to fix: this is where each request's own content (the user turn) "
                 "starts, after the prefix it shares with earlier requests.",
    UNDECODED: "Only token ids are known here: audit with --server URL or --tokenizer DIR to "
               "see the text that varies.",
    "text": "Text varies here (RAG passages, few-shot examples, per-user instructions): put the "
            "stable instructions, tools and examples first and the variable text last.",
}


def guess_kind(mine: str, theirs: str, before: str = "", shared: float | None = None,
               decoded: bool = True) -> str:
    """What varies where two prompts diverge: the text right after the divergence, joined to
    the rest of its line before it (a timestamp often diverges in its last digits).

    ``shared``: the share of the prompt before the divergence; at or above
    OWN_CONTENT_SHARE it is the request's own content. ``decoded=False``: the text is token
    ids joined (no tokenizer), which look like numbers and say nothing about what varies."""
    if shared is not None and shared >= OWN_CONTENT_SHARE:
        return OWN_CONTENT
    if not decoded:
        return UNDECODED
    line = before.rsplit("\n", 1)[-1][-32:]
    mine = line + mine.split("\n", 1)[0][:48]
    theirs = line + theirs.split("\n", 1)[0][:48]
    if _DATE.search(mine) and _DATE.search(theirs):
        return "date/time"
    keys_a, keys_b = _KEY.findall(mine), _KEY.findall(theirs)
    if keys_a and keys_b and keys_a != keys_b and set(keys_a) & set(keys_b):
        return "key order"
    if keys_a and keys_b and keys_a[:1] != keys_b[:1]:
        return "key order"
    if _ID.search(mine) and _ID.search(theirs):
        return "id"
    if re.search(r"\d", mine) and re.search(r"\d", theirs):
        return "number"
    if _NAME.search(mine) and _NAME.search(theirs) and _NAME.findall(mine) != _NAME.findall(
            theirs):
        return "name"
    return "text"


#: The text of a token that can be part of a value of each kind, read back from where two
#: prompts part (a token's text with its spaces stripped; a token of spaces only is a gap
#: inside the value). A kind not named here starts where the prompts part.
_VALUE_PIECE = {
    "date/time": re.compile(r"[\d\-:/.,T+Z]+|(Mon|Tue|Wed|Thu|Fri|Sat|Sun|Jan|Feb|Mar|Apr|May|"
                            r"Jun|Jul|Aug|Sep|Oct|Nov|Dec)[A-Za-z]*\.?,?"),
    "id": re.compile(r"[0-9a-fA-F\-]+"),
    "number": re.compile(r"[\d.,]+"),
}


#: Token texts a reader keeps (the tokens before divergences repeat: a timestamp's digits).
PIECE_CACHE = 4096


def one_token_reader(decode: Callable[[list[int]], str]) -> Callable[[int], str]:
    """The text of one token at a time through ``decode`` (token ids -> text), in a bounded
    cache: what ``value_start`` reads back with."""
    return functools.lru_cache(maxsize=PIECE_CACHE)(lambda token: decode([token]))


def value_start(kind: str, before: Sequence[int], piece: Callable[[int], str]) -> int:
    """How many of the tokens right before a divergence belong to the value that varies
    there, so that the culprit is named where the value starts, not where two requests
    happened to part: one timestamp parts in its seconds from a request a second older and in
    its minutes from one a minute older, but it starts at one token. ``before``: the token
    ids before the divergence, in prompt order (as many as known); ``piece``: one token's
    text, asked only for the tokens read back. The value ends at a line break or a token
    that cannot belong to it, and starts at a digit or a letter, never at a separator (the
    ':' of 'time: 2026-...')."""
    pattern = _VALUE_PIECE.get(kind)
    if pattern is None:
        return 0
    texts: list[str] = []
    for token in reversed(before):
        text = piece(token)
        bare = text.strip(" \t")
        if "\n" in text or "\r" in text or (bare and not pattern.fullmatch(bare)):
            break
        texts.append(text)
    while texts and not any(ch.isalnum() for ch in texts[-1]):
        texts.pop()
    return len(texts)
