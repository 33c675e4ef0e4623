"""Request logs: JSONL lines in the OpenAI chat, completion or pre-tokenized form."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TextIO


@dataclass
class LogRequest:
    """One request of a log, as the server would receive it."""

    where: str  # "file:line", for messages
    messages: list[dict[str, Any]] | None = None
    tools: list[Any] | None = None
    prompt: str | None = None
    token_ids: list[int] | None = None
    lora: str | None = None
    cache_salt: str | None = None

    @property
    def extra_keys(self) -> tuple[str | None, str | None] | None:
        if self.lora is None and self.cache_salt is None:
            return None
        return (self.lora, self.cache_salt)


@dataclass
class BadLine:
    where: str
    reason: str


def parse_request(obj: Any, where: str) -> LogRequest:
    """A request object in any of the accepted forms; ValueError with a reason otherwise."""
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    lora = obj.get("lora")
    salt = obj.get("cache_salt")
    for name, value in (("lora", lora), ("cache_salt", salt)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string")
    if "prompt_token_ids" in obj:
        ids = obj["prompt_token_ids"]
        if not isinstance(ids, list) or not ids or not all(
                isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise ValueError("prompt_token_ids must be a non-empty list of token ids")
        return LogRequest(where, token_ids=ids, lora=lora, cache_salt=salt)
    if "messages" in obj:
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("messages must be a non-empty list of {role, content} objects")
        tools = obj.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ValueError("tools must be a list")
        return LogRequest(where, messages=messages, tools=tools, lora=lora, cache_salt=salt)
    if "prompt" in obj:
        prompt = obj["prompt"]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return LogRequest(where, token_ids=prompt, lora=lora, cache_salt=salt)
        if not isinstance(prompt, str) or not prompt:
            raise ValueError("prompt must be a non-empty string")
        return LogRequest(where, prompt=prompt, lora=lora, cache_salt=salt)
    raise ValueError("no messages, prompt or prompt_token_ids")


def read_jsonl(paths: list[str], stdin: TextIO | None = None
               ) -> Iterator[LogRequest | BadLine]:
    """Every line of every log, oldest first; a bad line becomes a BadLine, never an error."""
    for path in paths:
        stream = (stdin or sys.stdin) if path == "-" else open(  # noqa: SIM115
            path, encoding="utf-8", errors="replace")
        name = "<stdin>" if path == "-" else path
        try:
            for number, line in enumerate(stream, 1):
                where = f"{name}:{number}"
                if not line.strip():
                    continue
                try:
                    yield parse_request(json.loads(line), where)
                except json.JSONDecodeError as exc:
                    yield BadLine(where, f"not JSON ({exc.msg})")
                except ValueError as exc:
                    yield BadLine(where, str(exc))
        finally:
            if stream is not sys.stdin and stream is not stdin:
                stream.close()
