"""vLLM's own request log lines: the request's token ids and LoRA adapter.

The lines (``--enable-log-requests`` with ``VLLM_LOGGING_LEVEL=DEBUG``), as written by
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
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from prefixwatch.core.logs.request import BadLine, LogRequest
from prefixwatch.core.logs.tokenids import json_ids

#: The start of any line vLLM's logger writes ("INFO 11-30 06:11:52 [...]"), optionally
#: behind a process prefix ("(APIServer pid=7) ").
VLLM_LOG_PREFIX = re.compile(r"^\s*(\(\w+ pid=\d+\)\s+)?(DEBUG|INFO|WARNING|ERROR|CRITICAL)"
                             r"\s+\d\d-\d\d \d\d:\d\d:\d\d")

_DETAILS = " details: prompt: "
_IDS = ", prompt_token_ids: "
_LORA = "lora_request: "
_NO_IDS = "vLLM request line without prompt_token_ids"
_RECEIVED = re.compile(r"Received request (\S+): ")
_REQUEST_ID = re.compile(r"Request (\S+) details: prompt: ")
_LORA_NAME = re.compile(r"lora_name='((?:[^'\\]|\\.)*)'")


def _token_ids(text: str) -> array | None:
    """The ``[1, 2, 3]`` after prompt_token_ids, or None when absent or cut mid-list; the
    list is JSON, read as a JSON line's ids are (simdjson, else the strict decoder, which
    says what is wrong)."""
    if text.startswith("None"):
        return None
    end = text.find("]")
    if not text.startswith("[") or end < 0:
        raise ValueError("prompt_token_ids list is not closed (a partial line?)")
    listed = text[:end + 1]
    ids = json_ids(listed.encode("utf-8", errors="replace"))
    if ids is not None:
        return ids if ids else None
    from prefixwatch.core.logs.strictline import listed_ids

    return listed_ids(listed)


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
