"""Token ids as the prefix index holds them: ``array('I')``, 4 bytes a token.

Two ways in: a list (a tokenizer's, or a decoded one), copied with ``packed_ids``; and a JSON
list of ids, which simdjson parses and checks in C (``json_ids``, ``simdjson_ids``): every
element a JSON integer from 0 to 2**64 - 1, copied out as one buffer of 64-bit words, never as
Python integers; the high words are then checked to be 0 in place and the low words kept, one
C-level strided copy. Whatever these refuse (None) is read again by the strict decoder
(``core/logs/strictline.py``), which says why; whatever they accept, it would accept with the same
values.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections.abc import Sequence

import simdjson

#: The index of the low 32-bit word of a 64-bit one in memory.
_LOW = 0 if sys.byteorder == "little" else 1
_local = threading.local()
_zeros = array("I")


def packed_ids(ids: Sequence[int]) -> array:
    """Token ids as the prefix index holds them, ``array('I')`` (4 bytes a token); a ValueError
    for an id beyond 32 bits (no tokenizer's vocabulary is that large)."""
    try:
        if type(ids) is list:  # a decoded list: array.fromlist is the quicker copy
            out = array("I")
            out.fromlist(ids)
            return out
        return array("I", ids)
    except OverflowError:
        raise ValueError("token id beyond 32 bits (no vocabulary is that large)") from None


def parse(text: bytes | str) -> object | None:
    """simdjson's document for ``text`` (a ``simdjson.Object``, ``Array`` or a value), from
    this thread's parser; None for text it refuses (not JSON, not UTF-8, too deep).

    A parser is reused line after line (its buffers stay allocated), so the document must be
    dropped before the next call; should one still be held, the thread gets a new parser."""
    try:
        parser = _local.parser
    except AttributeError:
        parser = _local.parser = simdjson.Parser()
    try:
        return parser.parse(text)
    except ValueError:  # not JSON; UnicodeDecodeError (not UTF-8) is a ValueError too
        return None
    except RuntimeError:  # too deep, or a document of the last parse still held
        _local.parser = simdjson.Parser()
        return None


def simdjson_ids(ids: simdjson.Array) -> array | None:
    """A parsed flat JSON array of token ids as ``array('I')``; None unless every element is
    an integer from 0 to 2**32 - 1. The caller makes sure the array nests no other array
    (simdjson would flatten it)."""
    try:
        wide = ids.as_buffer(of_type="u")  # refuses bool, float, null, negative, ...
    except (TypeError, ValueError):
        return None
    global _zeros
    words = array("I")
    words.frombytes(wide)
    half = len(words) >> 1
    if len(_zeros) < half:  # a new one, never resized: another thread may be reading it
        _zeros = array("I", bytes(4 * half))
    if memoryview(words)[1 - _LOW::2] != memoryview(_zeros)[:half]:
        return None  # an id beyond 32 bits (compared in place: no copy of the high words)
    return words[_LOW::2]


def json_ids(text: bytes) -> array | None:
    """``[1, 2, 3]`` (JSON) as ``array('I')``; None unless it is plainly a list of token ids
    (one flat list, every element an integer from 0 to 2**32 - 1)."""
    if text[:1] != b"[" or text.find(b"[", 1) >= 0:
        return None  # not a list, or one that nests another
    doc = parse(text)
    return simdjson_ids(doc) if isinstance(doc, simdjson.Array) else None
