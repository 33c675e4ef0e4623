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

import threading
import time
from typing import IO


class RequestLogger:
    def __init__(self, stream: IO[str], max_log_len: int | None = None) -> None:
        self._stream = stream
        self._max = max_log_len
        self._lock = threading.Lock()

    def log(self, request_id: str, prompt: str | None, token_ids: list[int],
            extra_keys: tuple | None) -> None:
        ids = token_ids if self._max is None else token_ids[: self._max]
        text = prompt if prompt is None or self._max is None else prompt[: self._max]
        stamp = time.strftime("%m-%d %H:%M:%S")
        lora = extra_keys[0] if extra_keys else None
        lora_repr = "None" if lora is None else f"LoRARequest(lora_name='{lora}', lora_int_id=1)"
        lines = (
            f"DEBUG {stamp} [request_logger.py:47] Request {request_id} details: prompt: "
            f"{text!r}, prompt_token_ids: {ids}, prompt_embeds shape: None.\n"
            f"INFO {stamp} [request_logger.py:57] Received request {request_id}: params: "
            f"SamplingParams(n=1, temperature=0.0), lora_request: {lora_repr}.\n"
        )
        with self._lock:
            self._stream.write(lines)
            self._stream.flush()
