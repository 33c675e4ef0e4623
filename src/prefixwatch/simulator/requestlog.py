"""vLLM-format request log lines, so the request-level tools can be tested on what vLLM writes.

vLLM 0.33 with ``--enable-log-requests`` and ``VLLM_LOGGING_LEVEL=DEBUG`` writes,
from ``RequestLogger.log_inputs``:

    DEBUG 11-30 06:11:52 [request_logger.py:47] Request <id> details: prompt: '<text>',
    prompt_token_ids: [1, 2, ...], prompt_embeds shape: None.
    INFO 11-30 06:11:52 [request_logger.py:57] Received request <id>: params: ...,
    lora_request: None.

(each on one line), cut at ``--max-log-len`` characters / token ids when that is set.
"""

from __future__ import annotations

import json
import threading
import time
from typing import IO

FORMATS = ("vllm", "jsonl")


class RequestLogger:
    """``fmt="vllm"``: vLLM's own lines; ``"jsonl"``: a gateway's fleet log, one JSON object
    a request with its token ids and the replica that served it (the ledger's routing part)."""

    def __init__(self, stream: IO[str], max_log_len: int | None = None, fmt: str = "vllm"
                 ) -> None:
        if fmt not in FORMATS:
            raise ValueError(f"unknown request log format {fmt!r}")
        self._stream = stream
        self._max = max_log_len
        self._fmt = fmt
        self._lock = threading.Lock()

    def log(self, request_id: str, prompt: str | None, token_ids: list[int],
            extra_keys: tuple | None, replica: str | None = None, max_tokens: int = 16
            ) -> None:
        if self._fmt == "jsonl":
            record = {"request_id": request_id, "prompt_token_ids": token_ids,
                      "replica": replica, "max_tokens": max_tokens}
            if extra_keys:
                record.update(lora=extra_keys[0], cache_salt=extra_keys[1])
            with self._lock:
                self._stream.write(json.dumps(record, separators=(",", ":")) + "\n")
                self._stream.flush()
            return
        ids = token_ids if self._max is None else token_ids[: self._max]
        text = prompt if prompt is None or self._max is None else prompt[: self._max]
        stamp = time.strftime("%m-%d %H:%M:%S")
        lora = extra_keys[0] if extra_keys else None
        lora_repr = "None" if lora is None else f"LoRARequest(lora_name='{lora}', lora_int_id=1)"
        lines = (
            f"DEBUG {stamp} [request_logger.py:47] Request {request_id} details: prompt: "
            f"{text!r}, prompt_token_ids: {ids}, prompt_embeds shape: None.\n"
            f"INFO {stamp} [request_logger.py:57] Received request {request_id}: params: "
            f"SamplingParams(n=1, temperature=0.0, max_tokens={max_tokens}), "
            f"lora_request: {lora_repr}.\n"
        )
        with self._lock:
            self._stream.write(lines)
            self._stream.flush()
