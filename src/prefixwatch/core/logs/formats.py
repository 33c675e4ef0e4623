"""Request logs: JSONL lines in the OpenAI chat, completion or pre-tokenized form, and vLLM's
own request log lines, read line by line under a size limit, a bad line a BadLine.

A JSON line is decoded by ``core/logs/jsonline.py`` (simdjson's pass, else the strict decoder in
``core/logs/strictline.py``); vLLM's lines by ``core/logs/vllmlog.py``. ``audit`` and the exporter's
requests-log reader both read through ``parse_line``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import IO, Any, TextIO

from prefixwatch.core.logs.jsonline import decode_request
from prefixwatch.core.logs.request import BadLine, LogRequest
from prefixwatch.core.logs.vllmlog import VLLM_LOG_PREFIX, VllmLogJoiner

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
