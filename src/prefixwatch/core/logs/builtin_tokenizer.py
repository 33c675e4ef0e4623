"""A small deterministic tokenizer and a fixed chat template for the simulator.

It is not a real model's tokenizer: token counts differ from Llama's or Qwen's (roughly one
token per word, one per 1-3 digits, one per punctuation run). What matters for prefix caching
is preserved: the same text always gives the same ids, a change anywhere changes the ids from
there on, and chat messages and tools are rendered by one fixed template (Llama 3 style), so
a timestamp at the top of a system prompt breaks the prefix exactly as it would on a GPU.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterable, Sequence
from typing import Any

SPECIAL_TOKENS: dict[str, int] = {
    "<|begin_of_text|>": 1,
    "<|end_of_text|>": 2,
    "<|start_header_id|>": 3,
    "<|end_header_id|>": 4,
    "<|eot_id|>": 5,
    "<|python_tag|>": 6,
}
BOS = "<|begin_of_text|>"
VOCAB_SIZE = 128_000
_FIRST_ORDINARY_ID = 256

_SPECIAL_RE = "|".join(re.escape(s) for s in SPECIAL_TOKENS)
_PIECE = re.compile(
    rf"{_SPECIAL_RE}| ?[A-Za-z]+| ?\d{{1,3}}| ?[^\sA-Za-z\d]+|\s*\n|\s+(?!\S)|\s+"
)

#: Ordinary words the simulator uses to write its answers (so answers decode to text).
ANSWER_WORDS: tuple[str, ...] = tuple(
    " " + w for w in (
        "the of and to in is that for it as with was on be at by this are from or have an "
        "which not but can all will one there their if has more when so about what some "
        "them other would into time only could also two then first these may like any over "
        "new most after use such where through between each should well our because just "
        "those while both same under however value result cache prefix block token answer"
    ).split()
)


class Tokenizer:
    """Text <-> token ids. Ids come from a stable hash of each piece, so two processes agree;
    decoding works for every piece this process has encoded (bounded table)."""

    def __init__(self, max_decode_entries: int = 500_000) -> None:
        self._ids: dict[str, int] = dict(SPECIAL_TOKENS)
        self._pieces: dict[int, str] = {v: k for k, v in SPECIAL_TOKENS.items()}
        self._max = max_decode_entries
        self._lock = threading.Lock()
        for word in ANSWER_WORDS:
            self._id_of(word)

    def _id_of(self, piece: str) -> int:
        token = self._ids.get(piece)
        if token is None:
            digest = hashlib.blake2b(piece.encode(), digest_size=8).digest()
            token = _FIRST_ORDINARY_ID + int.from_bytes(digest, "big") % (
                VOCAB_SIZE - _FIRST_ORDINARY_ID)
            with self._lock:
                if len(self._ids) < self._max:
                    self._ids[piece] = token
                    self._pieces.setdefault(token, piece)
        return token

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        out = []
        for piece in _PIECE.findall(text):
            token = ids.get(piece)
            out.append(token if token is not None else self._id_of(piece))
        return out

    def encode_prompt(self, text: str) -> list[int]:
        """A completion prompt as vLLM encodes it: BOS first, unless the text starts with it."""
        ids = self.encode(text)
        return ids if text.startswith(BOS) else [SPECIAL_TOKENS[BOS], *ids]

    def decode(self, tokens: Iterable[int]) -> str:
        pieces = self._pieces
        return "".join(pieces.get(t, f"<{t}>") for t in tokens)

    def piece(self, token: int) -> str:
        return self._pieces.get(token, f"<{token}>")

    @property
    def answer_ids(self) -> list[int]:
        return [self._ids[w] for w in ANSWER_WORDS]


_shared: Tokenizer | None = None
_shared_lock = threading.Lock()


def shared_tokenizer() -> Tokenizer:
    """The process's one tokenizer, as one model has one vocabulary: every simulated replica
    decodes every id another replica produced (a piece is decodable once some replica of the
    process encoded it), as every replica of a real fleet decodes its model's whole
    vocabulary. With a tokenizer each, a replica's /detokenize answered ``<id>`` for a token
    only its sibling had seen (a timestamp's digits), and a culprit read back over it stopped
    there."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Tokenizer()
        return _shared


def render_tool(tool: Any) -> str:
    """Tools are serialised as given: key order is the caller's (an unordered dict shows)."""
    return json.dumps(tool, ensure_ascii=False)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            elif isinstance(part, str):
                parts.append(part)
        return "".join(parts)
    raise ValueError("message content must be a string or a list of text parts")


def apply_chat_template(messages: Sequence[dict[str, Any]], tools: Sequence[Any] | None = None,
                        add_generation_prompt: bool = True) -> str:
    """Llama-3-style rendering. Tools go into the system turn, after its content."""
    if not isinstance(messages, list | tuple) or not messages:
        raise ValueError("messages must be a non-empty list")
    out = [BOS]
    tools_text = ""
    if tools:
        tools_text = ("\n\nYou have access to the following functions. To call one, answer "
                      "with JSON {\"name\": ..., \"parameters\": ...}.\n"
                      + "\n".join(render_tool(t) for t in tools))
    system_seen = False
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise ValueError("each message needs a role")
        role = str(message["role"])
        content = _content_text(message.get("content"))
        if role == "system" and not system_seen:
            content += tools_text
            system_seen = True
        out.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>")
    if tools_text and not system_seen:
        out.insert(1, f"<|start_header_id|>system<|end_header_id|>\n\n{tools_text.strip()}"
                      "<|eot_id|>")
    if add_generation_prompt:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)
