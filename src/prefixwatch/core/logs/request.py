"""One request of a request log, as the server would receive it, or why a line is skipped."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


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
