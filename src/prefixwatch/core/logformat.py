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

import re
import sys
from array import array
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Annotated, Any, TextIO

import msgspec


@dataclass
class LogRequest:
    """One request of a log, as the server would receive it."""

    where: str  # "file:line", for messages
    messages: list[dict[str, Any]] | None = None
    tools: list[Any] | None = None
    prompt: str | None = None
    #: The prompt's token ids, as an ``array('I')`` when the log carried them.
    token_ids: Sequence[int] | None = None
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


#: A token id as a log may carry it: a JSON integer >= 0 (msgspec's ``int`` refuses booleans
#: and floats such as 1.0).
TokenId = Annotated[int, msgspec.Meta(ge=0)]
_Count = Annotated[int, msgspec.Meta(ge=0)]


def _line_type(token_id: Any) -> Any:
    """The fields of a JSONL request line, typed so that msgspec checks them while it
    decodes (one pass in C, no Python work per token); unknown fields are skipped."""
    ids = list[token_id]  # type: ignore[valid-type]
    return msgspec.defstruct("_RequestLine", [
        ("prompt_token_ids", ids | msgspec.UnsetType, msgspec.UNSET),
        ("messages", Any, msgspec.UNSET),
        ("tools", Any, None),
        ("prompt", str | ids | msgspec.UnsetType, msgspec.UNSET),
        ("lora", str | None, None),
        ("cache_salt", str | None, None),
        ("replica", str | None, None),
        ("cached_tokens", _Count | None, None),
        ("usage", Any, None),
        ("max_tokens", _Count | None, None),
    ], gc=False)


#: The rules of a line: every token id a JSON integer >= 0. Its messages name what is wrong.
_RequestLine = _line_type(TokenId)
#: The same fields with ids as plain integers (no bound checked per token): the fast first
#: pass. Packing the ids into ``array('I')`` refuses a negative id (or one beyond 32 bits)
#: anyway, and any line refused or not packable is decoded again with ``_RequestLine``, so
#: what is accepted and every reason given are the strict decoder's.
_FastLine = _line_type(int)

_decode_line = msgspec.json.Decoder(_RequestLine).decode
_decode_fast = msgspec.json.Decoder(_FastLine).decode
_decode_ids = msgspec.json.Decoder(list[TokenId]).decode
_decode_ids_fast = msgspec.json.Decoder(list[int]).decode

_IDS_REASON = "prompt_token_ids must be a non-empty list of token ids"
_FIELD_REASONS = {
    "prompt_token_ids": _IDS_REASON,
    "prompt": "prompt must be a non-empty string or a non-empty list of token ids",
    "lora": "lora must be a string",
    "cache_salt": "cache_salt must be a string",
    "replica": "replica must be a string",
    "cached_tokens": "cached_tokens must be a non-negative integer",
    "max_tokens": "max_tokens must be a non-negative integer",
}


def _invalid(exc: msgspec.ValidationError) -> ValueError:
    """msgspec's "Expected `int`, got `bool` - at `$.prompt_token_ids[3]`" as the reason a
    line is skipped: the field's rule, then what msgspec found and where."""
    detail, _, path = str(exc).partition(" - at `")
    path = path.rstrip("`")
    if not path:
        return ValueError("not a JSON object")
    field = path[2:].split("[", 1)[0].split(".", 1)[0]
    rule = _FIELD_REASONS.get(field, f"{field} is not valid")
    return ValueError(f"{rule} ({detail.lower()} at {path[2:]})")


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


def parse_request(obj: Any, where: str) -> LogRequest:
    """A request object in any of the accepted forms; ValueError with a reason otherwise."""
    try:
        line = msgspec.convert(obj, _RequestLine)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    return _request(line, where)


def decode_request(text: str | bytes, where: str) -> LogRequest:
    """One JSON line, decoded and checked in one pass; ValueError with a reason otherwise.

    The fast pass (``_FastLine``) accepts exactly the lines the strict one accepts, with the
    same values; a line it refuses, for whatever reason, is decoded again strictly, so the
    reason given is always the strict decoder's."""
    try:
        return _request(_decode_fast(text), where)
    except ValueError:  # msgspec's errors are ValueErrors too
        pass  # a bad line (or not UTF-8): the strict pass below says why
    try:
        line = _decode_line(text)
    except msgspec.ValidationError as exc:
        raise _invalid(exc) from None
    except msgspec.DecodeError as exc:
        if isinstance(text, bytes):  # not UTF-8: read it as the text decoder would
            return decode_request(text.decode("utf-8", errors="replace"), where)
        raise ValueError(f"not JSON ({exc})") from None
    return _request(line, where)


def _request(line: _RequestLine, where: str) -> LogRequest:
    found = _parse_prompt(line, where)
    found.replica, found.max_tokens = line.replica, line.max_tokens
    found.cached_tokens = _cached_tokens(line)
    return found


def _cached_tokens(line: _RequestLine) -> int | None:
    """``cached_tokens`` at the top, or in an OpenAI ``usage`` object; None when absent."""
    if line.cached_tokens is not None:
        return line.cached_tokens
    usage = line.usage
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("cached_tokens must be a non-negative integer")
    return value


def _parse_prompt(line: _RequestLine, where: str) -> LogRequest:
    lora, salt = line.lora, line.cache_salt
    if line.prompt_token_ids is not msgspec.UNSET:
        if not line.prompt_token_ids:
            raise ValueError(_IDS_REASON)
        return LogRequest(where, token_ids=packed_ids(line.prompt_token_ids), lora=lora,
                          cache_salt=salt)
    if line.messages is not msgspec.UNSET:
        messages = line.messages
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError("messages must be a non-empty list of {role, content} objects")
        tools = line.tools
        if tools is not None and not isinstance(tools, list):
            raise ValueError("tools must be a list")
        return LogRequest(where, messages=messages, tools=tools, lora=lora, cache_salt=salt)
    prompt = line.prompt
    if prompt is not msgspec.UNSET:
        if not prompt:
            raise ValueError(_FIELD_REASONS["prompt"])
        if isinstance(prompt, list):
            return LogRequest(where, token_ids=packed_ids(prompt), lora=lora, cache_salt=salt)
        return LogRequest(where, prompt=prompt, lora=lora, cache_salt=salt)
    raise ValueError("no messages, prompt or prompt_token_ids")


#: The longest log line read, shared by `audit` and the exporter's requests-log reader. A
#: 128k-token prompt as token ids is about 1 MB; past the limit a line is skipped and counted,
#: never held in memory.
MAX_LINE_BYTES = 4 * 1024 * 1024
#: One "line" longer than this (``/dev/zero``, a binary file) ends the reading of the file.
MAX_SKIP_BYTES = 16 * MAX_LINE_BYTES
LINE_TOO_LONG = f"line longer than {MAX_LINE_BYTES} bytes"


def bounded_lines(stream: IO[Any]) -> Iterator[tuple[str | bytes | None, str]]:
    """(line, "") for each line of a binary (bytes, undecoded: JSON is decoded from them
    directly) or text stream, or (None, why) for a line past MAX_LINE_BYTES, which is
    skipped in pieces; past MAX_SKIP_BYTES the file ends there."""
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
        yield line, ""


def read_jsonl(paths: list[str], stdin: TextIO | None = None,
               max_log_len: int | None = None) -> Iterator[LogRequest | BadLine]:
    """Every request of every log, oldest first: JSONL lines and vLLM's request log lines (other
    vLLM log output is passed over); a bad line becomes a BadLine, never an error."""
    for path in paths:
        if path == "-":
            text = stdin or sys.stdin
            stream: IO[Any] = getattr(text, "buffer", text)
        else:
            # A large buffer: a log of long prompts is read in a few big reads.
            stream = open(path, "rb", buffering=1 << 20)  # noqa: SIM115 - closed below
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
                    text = _text(line).strip()
                    if text and not VLLM_LOG_PREFIX.match(text):
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


def _token_ids(text: str) -> array | None:
    """The ``[1, 2, 3]`` after prompt_token_ids, or None when absent or cut mid-list; the
    list is JSON, so msgspec reads and checks it in one pass."""
    if text.startswith("None"):
        return None
    end = text.find("]")
    if not text.startswith("[") or end < 0:
        raise ValueError("prompt_token_ids list is not closed (a partial line?)")
    listed = text[:end + 1]
    try:  # the fast pass; a list it refuses is read again strictly, to say why
        ids = packed_ids(_decode_ids_fast(listed))
        return ids if ids else None
    except ValueError:
        pass
    try:
        ids = _decode_ids(listed)
    except msgspec.ValidationError as exc:
        if ">= 0" in str(exc):
            raise ValueError("negative token id") from None
        raise ValueError("prompt_token_ids holds something other than token ids") from None
    except msgspec.DecodeError:
        raise ValueError("prompt_token_ids holds something other than token ids") from None
    return packed_ids(ids) if ids else None


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

    def _cut(self, ids: Sequence[int]) -> bool:
        return self.max_log_len is not None and len(ids) >= self.max_log_len


def _text(line: str | bytes) -> str:
    return line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line


def parse_line(line: str | bytes, where: str, joiner: VllmLogJoiner
               ) -> list[LogRequest | BadLine] | None:
    """One line of either form, as text or as the bytes read (a JSON line is decoded from
    them directly): requests it completes, or None for a line of no request."""
    # A JSON line is decoded as it is (the decoder skips the newline): stripping would copy
    # every line of a log of long prompts once more.
    raw = line if line[:1] in ("{", b"{") else line.strip()
    if not raw:
        return None
    if raw[:1] in ("{", b"{"):
        try:
            return [decode_request(raw, where)]
        except ValueError as exc:
            return [BadLine(where, str(exc))]
    text = _text(raw)
    if joiner.is_request_line(text) or "Received request " in text:
        return joiner.feed(text, where)
    return None
