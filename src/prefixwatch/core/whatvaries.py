"""What varies where two prompts diverge (a date, an id, key order, ...) and its fix."""

from __future__ import annotations

import re

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
    "text": "Text varies here (RAG passages, few-shot examples, per-user instructions): put the "
            "stable instructions, tools and examples first and the variable text last.",
}


def guess_kind(mine: str, theirs: str, before: str = "") -> str:
    """What varies where two prompts diverge: the text right after the divergence, joined to
    the rest of its line before it (a timestamp often diverges in its last digits)."""
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
