"""One JSONL request line -> a LogRequest: simdjson's pass for a pre-tokenized line, the
strict decoder (``core/logs/strictline.py``) for any other line and for the reason a line is bad.

The pass takes a line that is one JSON object holding exactly one list, its
``prompt_token_ids`` (or the ``prompt`` of a completion, when there is neither
``prompt_token_ids`` nor ``messages``): simdjson checks the JSON and copies the ids out in C
(``core/logs/tokenids.py``), and any of ``OTHER_FIELDS`` present are checked by the strict
decoder's own types. Anything it does not take (a second list, a nested one, a repeated key,
an id that is not an integer from 0 to 2**32 - 1, a bad field, more than ``MAX_OBJECTS``
braces) goes to the strict decoder, so the lines accepted, their values and every reason
given are the strict decoder's.
"""

from __future__ import annotations

from typing import Any

import simdjson

from prefixwatch.core.logs import tokenids
from prefixwatch.core.logs.request import LogRequest

IDS = "prompt_token_ids"
#: The fields of a pre-tokenized line besides its ids that the request carries on.
OTHER_FIELDS = frozenset({"lora", "cache_salt", "replica", "cached_tokens", "usage",
                          "max_tokens"})
#: More braces than this and a line goes to the strict decoder, whose nesting limit is the
#: interpreter's (about 1,000 levels; simdjson's is 1,024).
MAX_OBJECTS = 256
_Object, _Array = simdjson.Object, simdjson.Array


def decode_request(text: str | bytes, where: str) -> LogRequest:
    """One JSON line, decoded and checked; ValueError with the strict decoder's reason."""
    found = _fast(text, where)
    if found is not None:
        return found
    from prefixwatch.core.logs import strictline

    return strictline.decode_request(text, where)


def _fast(text: str | bytes, where: str) -> LogRequest | None:
    """simdjson's pass; None for a line it leaves to the strict decoder."""
    if isinstance(text, bytes):
        raw = text
    else:
        try:
            raw = text.encode()
        except UnicodeEncodeError:
            return None
    first = raw.find(b"[")
    if first < 0 or raw.find(b"[", first + 1) >= 0:
        return None
    if raw.find(b"{", 1) >= 0 and raw.count(b"{") > MAX_OBJECTS:
        return None
    doc: Any = tokenids.parse(raw)
    if doc.__class__ is not _Object:
        return None
    if len(doc) == 1:  # {"prompt_token_ids": [...]}, the usual pre-tokenized line
        value = doc.get(IDS)
        if value.__class__ is _Array:
            ids = tokenids.simdjson_ids(value)
            return LogRequest(where, token_ids=ids) if ids else None
    keys = list(doc.keys())
    fields = set(keys)
    if len(fields) != len(keys):
        return None  # a repeated key: which one counts is the strict decoder's rule
    if IDS in fields:
        if "prompt" in fields:
            return None  # the strict decoder checks the prompt too
        value = doc[IDS]
    elif "prompt" in fields and "messages" not in fields:
        value = doc["prompt"]
    else:
        return None
    ids = tokenids.simdjson_ids(value) if value.__class__ is _Array else None
    if not ids:
        return None
    present = fields & OTHER_FIELDS
    if not present:
        return LogRequest(where, token_ids=ids)
    return _with_fields(ids, {k: _plain(doc[k]) for k in present}, where)


def _plain(value: Any) -> Any:
    """A field's value as Python objects (only objects and scalars: the line's one list is
    its ids)."""
    return value.as_dict() if value.__class__ is _Object else value


def _with_fields(ids: Any, values: dict[str, Any], where: str) -> LogRequest | None:
    from prefixwatch.core.logs import strictline

    line = strictline.other_fields(values)
    if line is None:
        return None
    try:
        cached = strictline.cached_tokens(line)
    except ValueError:
        return None
    return LogRequest(where, token_ids=ids, lora=line.lora, cache_salt=line.cache_salt,
                      replica=line.replica, cached_tokens=cached, max_tokens=line.max_tokens)
