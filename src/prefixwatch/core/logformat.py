"""Request logs: JSONL lines in the OpenAI chat, completion or pre-tokenized form, and vLLM's
own request log lines.

vLLM's lines (``--enable-log-requests`` with ``VLLM_LOGGING_LEVEL=DEBUG``), as written by
``RequestLogger.log_inputs`` (``vllm/entrypoints/serve/utils/request_logger.py``, vLLM 0.33)::

    DEBUG 11-30 06:11:52 [request_logger.py:47] Request <id> details: prompt: '...',
      prompt_token_ids: [1, 2, ...], prompt_embeds shape: None.
    INFO 11-30 06:11:52 [request_logger.py:57] Received request <id>: params: ...,
      lora_request: None.

each on one line; and the single INFO line of older releases (``vllm/entrypoints/logger.py``)::

    INFO ... Received request <id>: prompt: '...', params: ..., prompt_token_ids: [...],
      [prompt_embeds shape: None, ]lora_request: None, prompt_adapter_request: None.

Token ids and prompt are cut at ``--max-log-len`` when it is set. The LoRA adapter of the
newer form is on the INFO line that follows the DEBUG one; the two are joined by request id.
"""

from __future__ import annotations

import json
import re
import sys
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, TextIO


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
    #: The token ids were cut at --max-log-len: only their start is known.
    truncated: bool = False
    #: The replica (pod, target) that served it, when a fleet log says so (the ledger's
    #: routing part needs it).
    replica: str | None = None
    #: Prompt tokens the engine served from its caches (OpenAI usage
    #: prompt_tokens_details.cached_tokens), when the log carries them.
    cached_tokens: int | None = None
    #: The most tokens it may generate (vLLM's SamplingParams.max_tokens): blocks its answer
    #: takes in the pool.
    max_tokens: int | None = None

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
    replica = obj.get("replica")
    for name, value in (("lora", lora), ("cache_salt", salt), ("replica", replica)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string")
    cached = _cached_tokens(obj)
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(
            max_tokens, bool) or max_tokens < 0):
        raise ValueError("max_tokens must be a non-negative integer")
    found = _parse_prompt(obj, where, lora, salt)
    found.replica, found.cached_tokens, found.max_tokens = replica, cached, max_tokens
    return found


def _cached_tokens(obj: dict[str, Any]) -> int | None:
    """``cached_tokens`` at the top, or in an OpenAI ``usage`` object; None when absent."""
    value = obj.get("cached_tokens")
    usage = obj.get("usage")
    if value is None and isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        value = details.get("cached_tokens") if isinstance(details, dict) else None
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("cached_tokens must be a non-negative integer")
    return value


def _parse_prompt(obj: dict[str, Any], where: str, lora: str | None, salt: str | None
                  ) -> LogRequest:
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


#: The longest log line read, shared by `audit` and the exporter's requests-log reader. A
#: 128k-token prompt as token ids is about 1 MB; past the limit a line is skipped and counted,
#: never held in memory.
MAX_LINE_BYTES = 4 * 1024 * 1024
#: One "line" longer than this (``/dev/zero``, a binary file) ends the reading of the file.
MAX_SKIP_BYTES = 16 * MAX_LINE_BYTES
LINE_TOO_LONG = f"line longer than {MAX_LINE_BYTES} bytes"


def bounded_lines(stream: IO[Any]) -> Iterator[tuple[str | None, str]]:
    """(line, "") for each line of a binary or text stream, or (None, why) for a line past
    MAX_LINE_BYTES, which is skipped in pieces; past MAX_SKIP_BYTES the file ends there."""
    while True:
        line = stream.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        newline = b"\n" if isinstance(line, bytes) else "\n"
        if len(line) > MAX_LINE_BYTES and not line.endswith(newline):
            skipped = len(line)
            while skipped <= MAX_SKIP_BYTES:
                more = stream.readline(1 << 20)
                skipped += len(more)
                if not more or more.endswith(newline):
                    break
            else:
                yield None, f"{LINE_TOO_LONG} and no end in sight: rest of the file skipped"
                return
            yield None, LINE_TOO_LONG
            continue
        yield (line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line), ""


def read_jsonl(paths: list[str], stdin: TextIO | None = None,
               max_log_len: int | None = None) -> Iterator[LogRequest | BadLine]:
    """Every request of every log, oldest first: JSONL lines and vLLM's request log lines (other
    vLLM log output is passed over); a bad line becomes a BadLine, never an error."""
    for path in paths:
        if path == "-":
            text = stdin or sys.stdin
            stream: IO[Any] = getattr(text, "buffer", text)
        else:
            stream = open(path, "rb")  # noqa: SIM115 - closed below
        name = "<stdin>" if path == "-" else path
        joiner = VllmLogJoiner(max_log_len)
        try:
            for number, (line, why) in enumerate(bounded_lines(stream), 1):
                where = f"{name}:{number}"
                if line is None:
                    yield BadLine(where, why)
                    continue
                found = parse_line(line, where, joiner)
                if found is None:
                    if line.strip() and not VLLM_LOG_PREFIX.match(line):
                        yield BadLine(where, "neither JSON nor a vLLM request log line")
                    continue
                yield from found
            yield from joiner.flush()
        finally:
            if path != "-":
                stream.close()


#: The start of any line vLLM's logger writes ("INFO 11-30 06:11:52 [...]"), optionally
#: behind a process prefix ("(APIServer pid=7) ").
VLLM_LOG_PREFIX = re.compile(r"^\s*(\(\w+ pid=\d+\)\s+)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)"
                             r"\s+\d\d-\d\d \d\d:\d\d:\d\d")


# -- vLLM's own request log lines ------------------------------------------------------------------

_DETAILS = " details: prompt: "
_IDS = ", prompt_token_ids: "
_LORA = "lora_request: "
_NO_IDS = "vLLM request line without prompt_token_ids"
_RECEIVED = re.compile(r"Received request (\S+): ")
_REQUEST_ID = re.compile(r"Request (\S+) details: prompt: ")
_LORA_NAME = re.compile(r"lora_name='((?:[^'\\]|\\.)*)'")


def _token_ids(text: str) -> list[int] | None:
    """The ``[1, 2, 3]`` after prompt_token_ids, or None when absent or cut mid-list."""
    if text.startswith("None"):
        return None
    end = text.find("]")
    if not text.startswith("[") or end < 0:
        raise ValueError("prompt_token_ids list is not closed (a partial line?)")
    body = text[1:end].strip()
    if not body:
        return None
    try:
        ids = [int(t) for t in body.split(",")]
    except ValueError:
        raise ValueError("prompt_token_ids holds something other than token ids") from None
    if any(t < 0 for t in ids):
        raise ValueError("negative token id")
    return ids


def _lora_after(text: str) -> str | None:
    """The adapter named after the last ``lora_request: `` of a line (None: no adapter)."""
    at = text.rfind(_LORA)
    if at < 0:
        return None
    rest = text[at + len(_LORA):]
    if rest.startswith("None"):
        return None
    match = _LORA_NAME.search(rest)
    return match.group(1) if match else "unnamed-lora"


_MAX_TOKENS = re.compile(r"\bmax_tokens=(\d+)")


class VllmLogJoiner:
    """Turns vLLM log lines into requests: the DEBUG details line waits (bounded) for its
    INFO line, which names the LoRA adapter; lines of no request give None."""

    PENDING = 256

    def __init__(self, max_log_len: int | None = None) -> None:
        self.max_log_len = max_log_len
        self._pending: OrderedDict[str, LogRequest] = OrderedDict()

    @staticmethod
    def is_request_line(line: str) -> bool:
        return _DETAILS in line or ("Received request " in line and _IDS in line)

    def feed(self, line: str, where: str) -> list[LogRequest | BadLine]:
        """Requests completed by this line (possibly older pending ones), oldest first."""
        out: list[LogRequest | BadLine] = []
        if _DETAILS in line:
            match = _REQUEST_ID.search(line)
            if match is None:
                return [BadLine(where, _NO_IDS)]
            found = self._request(line, where)
            if isinstance(found, BadLine):
                return [found]
            self._pending[match.group(1)] = found
            while len(self._pending) > self.PENDING:
                out.append(self._pending.popitem(last=False)[1])
            return out
        match = _RECEIVED.search(line)
        if match is None:
            return out
        rest = line[match.end():]
        if rest.startswith("prompt: "):  # older vLLM: everything on one line
            found = self._request(rest, where)
            if isinstance(found, LogRequest):
                found.lora = _lora_after(rest)
            return [found]
        req = self._pending.pop(match.group(1), None)
        if req is not None:
            req.lora = _lora_after(rest)
            tokens = _MAX_TOKENS.search(rest)
            req.max_tokens = int(tokens.group(1)) if tokens else None
            out.append(req)
        return out

    def _request(self, text: str, where: str) -> LogRequest | BadLine:
        """The request whose prompt_token_ids list ``text`` holds, or why it cannot be read."""
        ids_at = text.rfind(_IDS)
        if ids_at < 0:
            return BadLine(where, _NO_IDS)
        try:
            ids = _token_ids(text[ids_at + len(_IDS):])
        except ValueError as exc:
            return BadLine(where, str(exc))
        if ids is None:
            return BadLine(where, "no prompt token ids (prompt embeddings?)")
        return LogRequest(where, token_ids=ids, truncated=self._cut(ids))

    def flush(self) -> list[LogRequest]:
        """Requests whose INFO line never came (another log level, a cut log)."""
        out = list(self._pending.values())
        self._pending.clear()
        return out

    def _cut(self, ids: list[int]) -> bool:
        return self.max_log_len is not None and len(ids) >= self.max_log_len


def parse_line(line: str, where: str, joiner: VllmLogJoiner
               ) -> list[LogRequest | BadLine] | None:
    """One line of either form: requests it completes, or None for a line of no request."""
    text = line.strip()
    if not text:
        return None
    if text.startswith("{"):
        try:
            return [parse_request(json.loads(text), where)]
        except json.JSONDecodeError as exc:
            return [BadLine(where, f"not JSON ({exc.msg})")]
        except ValueError as exc:
            return [BadLine(where, str(exc))]
    if joiner.is_request_line(text) or "Received request " in text:
        return joiner.feed(text, where)
    return None
