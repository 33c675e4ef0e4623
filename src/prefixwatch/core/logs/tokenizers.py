"""Token ids exactly as the server would compute them (chat template included).

- ``ServerTokenizer``: vLLM's ``POST /tokenize`` (and ``/detokenize`` for context), many
  requests in flight at once;
- ``HFTokenizer``: a local Hugging Face tokenizer directory through transformers'
  ``apply_chat_template``, offline;
- ``BuiltinTokenizer``: the simulator's tokenizer (``--tokenizer builtin``), to audit logs
  replayed against ``prefixwatch simulate``;
- pre-tokenized requests need none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from prefixwatch.core.logs.formats import LogRequest


class AuditError(Exception):
    """A setup problem (unreachable server, missing tokenizer): exit status 2."""


class Tokenizer(Protocol):
    def tokenize(self, batch: Sequence[LogRequest]) -> list[Sequence[int] | str]:
        """Token ids per request, or an error string for that request."""

    def decode(self, tokens: Sequence[int]) -> str: ...


def _pretokenized(req: LogRequest) -> Sequence[int] | None:
    """The log's own token ids, as read (no copy: a long log holds millions)."""
    return req.token_ids


class OneByOne:
    """Tokenizes a batch request by request; pre-tokenized requests pass through."""

    def tokenize(self, batch: Sequence[LogRequest]) -> list[Sequence[int] | str]:
        return [_pretokenized(req) or self._one(req) for req in batch]

    def _one(self, req: LogRequest) -> Sequence[int] | str:
        raise NotImplementedError


class NoTokenizer:
    """Only pre-tokenized lines; others are reported as needing --server or --tokenizer."""

    def tokenize(self, batch: Sequence[LogRequest]) -> list[Sequence[int] | str]:
        return [_pretokenized(r) or "text request: give --server URL or --tokenizer DIR"
                for r in batch]

    def decode(self, tokens: Sequence[int]) -> str:
        return " ".join(str(t) for t in tokens)


class BuiltinTokenizer(OneByOne):
    def __init__(self) -> None:
        from prefixwatch.core.logs.builtin_tokenizer import Tokenizer, apply_chat_template

        self._tok = Tokenizer()
        self._template = apply_chat_template

    def _one(self, req: LogRequest) -> list[int] | str:
        if req.messages is not None:
            try:
                return self._tok.encode(self._template(req.messages, req.tools))
            except ValueError as exc:
                return str(exc)
        assert req.prompt is not None
        return self._tok.encode_prompt(req.prompt)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._tok.decode(tokens)


class ServerTokenizer:
    """vLLM's /tokenize, several requests in flight (vLLM takes one prompt per call).

    ``requests`` (and ``neterrors``, which needs it) and the thread pool are imported here,
    not with the module: an audit of pre-tokenized lines never pays for them."""

    def __init__(self, base_url: str, concurrency: int = 16, timeout: float = 30.0) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import requests

        from prefixwatch.core import neterrors

        self.base = base_url.rstrip("/").removesuffix("/metrics")
        self.session = requests.Session()
        self.session.trust_env = False
        self.timeout = timeout
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="tokenize")
        try:
            resp = self.session.get(f"{self.base}/health", timeout=5)
        except requests.RequestException as exc:
            raise AuditError(f"cannot tokenize: {neterrors.describe(exc, self.base)}") from exc
        if resp.status_code >= 400:
            raise AuditError(f"{self.base}/health answered HTTP {resp.status_code}")

    def _one(self, req: LogRequest) -> Sequence[int] | str:
        import requests

        from prefixwatch.core import neterrors

        ids = _pretokenized(req)
        if ids is not None:
            return ids
        body: dict[str, Any]
        if req.messages is not None:
            body = {"messages": req.messages, "add_generation_prompt": True}
            if req.tools:
                body["tools"] = req.tools
        else:
            body = {"prompt": req.prompt}
        if req.lora:
            body["model"] = req.lora
        try:
            resp = self.session.post(f"{self.base}/tokenize", json=body, timeout=self.timeout)
        except requests.RequestException as exc:
            raise AuditError("the server stopped answering: "
                             f"{neterrors.describe(exc, self.base)}") from exc
        if resp.status_code != 200:
            return f"/tokenize answered HTTP {resp.status_code}: {resp.text[:200]}"
        tokens = resp.json().get("tokens")
        return tokens if isinstance(tokens, list) else "/tokenize returned no tokens"

    def tokenize(self, batch: Sequence[LogRequest]) -> list[Sequence[int] | str]:
        return list(self.pool.map(self._one, batch))

    def decode(self, tokens: Sequence[int], strict: bool = False) -> str:
        """Text of the tokens; their ids joined when /detokenize fails (``strict``: raise)."""
        import requests

        try:
            resp = self.session.post(f"{self.base}/detokenize", json={"tokens": list(tokens)},
                                     timeout=self.timeout)
            if resp.status_code == 200:
                return str(resp.json().get("prompt", ""))
            if strict:
                raise AuditError(f"/detokenize answered HTTP {resp.status_code}")
        except requests.RequestException as exc:
            if strict:
                raise AuditError(f"/detokenize failed: {exc}") from exc
        return " ".join(str(t) for t in tokens)

    def block_size(self) -> int | None:
        """The server's block size, from vllm:cache_config_info on its /metrics."""
        import requests

        try:
            page = self.session.get(f"{self.base}/metrics", timeout=10).text
        except requests.RequestException:
            return None
        return block_size_on_page(page)


def block_size_on_page(page: str) -> int | None:
    """The one block size that the page's cache_config_info series declare, else None."""
    from prometheus_client.parser import text_string_to_metric_families

    from prefixwatch.core.vocab import schemas

    sizes: set[int] = set()
    try:
        for family in text_string_to_metric_families(page):
            if family.name != schemas.VLLM_V1.cache_config_info:
                continue
            for sample in family.samples:
                value = sample.labels.get(schemas.CACHE_INFO_BLOCK_SIZE, "")
                if value.isdigit() and int(value) > 0:
                    sizes.add(int(value))
    except ValueError:
        return None
    return sizes.pop() if len(sizes) == 1 else None


class HFTokenizer(OneByOne):
    """A Hugging Face tokenizer directory, offline (transformers is an optional dependency)."""

    def __init__(self, directory: str) -> None:
        if not Path(directory).is_dir():
            raise AuditError(f"tokenizer directory {directory!r} does not exist")
        try:
            import jinja2  # noqa: F401 - transformers renders chat templates with it
            from transformers import AutoTokenizer  # type: ignore[import-not-found]
        except ImportError as exc:
            raise AuditError("--tokenizer needs transformers: pip install "
                             "'prefixwatch[hf]' (or use --server)") from exc
        try:
            self._tok = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except Exception as exc:  # transformers raises many kinds
            raise AuditError(f"cannot load a tokenizer from {directory!r}: {exc}") from exc

    def _one(self, req: LogRequest) -> list[int] | str:
        try:
            if req.messages is not None:
                ids = self._tok.apply_chat_template(
                    req.messages, tools=req.tools, add_generation_prompt=True, tokenize=True)
                if not isinstance(ids, list):  # newer transformers: a BatchEncoding
                    ids = ids["input_ids"]
            else:
                ids = self._tok.encode(req.prompt)
            return list(ids)
        except Exception as exc:
            return f"tokenizer failed: {exc}"

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._tok.decode(list(tokens)))


def open_tokenizer(server: str | None = None, directory: str | None = None) -> Tokenizer:
    """A server's /tokenize, 'builtin' or a tokenizer directory; without either, pre-tokenized
    requests only. Raises AuditError when the one asked for cannot be had."""
    if server:
        return ServerTokenizer(server)
    if directory == "builtin":
        return BuiltinTokenizer()
    if directory:
        return HFTokenizer(directory)
    return NoTokenizer()
