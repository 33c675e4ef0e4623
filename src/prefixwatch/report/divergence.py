"""With a request log: where prompts first stop sharing a prefix, decoded, and its fix.

The audit's finding, computed from core's pieces (the prefix index, what-varies, the log
formats and tokenizers), so the report needs nothing from the audit package: the most
frequent divergence position that is not where each request's own content starts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from prefixwatch.core.cache.prefixindex import CONTEXT_TOKENS, Divergence, PrefixIndex
from prefixwatch.core.cache.whatvaries import FIXES, OWN_CONTENT, OWN_CONTENT_SHARE, guess_kind
from prefixwatch.core.logs.formats import LogRequest, read_jsonl
from prefixwatch.core.logs.tokenizers import AuditError, NoTokenizer, Tokenizer, open_tokenizer
from prefixwatch.report.promapi import ReportError

MAX_REQUESTS = 50_000
BATCH = 64


@dataclass(frozen=True)
class Finding:
    requests: int
    achievable: float | None
    position: int
    count: int
    kind: str
    context: str
    fix: str


def first_divergence(path: str, block_size: int = 16, tokenizer: str | None = None,
                     max_requests: int = MAX_REQUESTS) -> Finding | None:
    """The log's most frequent early divergence (None when every request shares its prefix
    up to its own content, or the log is empty). ``tokenizer``: 'builtin', a Hugging Face
    directory, an http(s) server for /tokenize, or None for pre-tokenized lines only."""
    try:
        open(path, "rb").close()
    except OSError as exc:
        raise ReportError(f"cannot read the request log {path}: {exc.strerror}") from None
    try:
        tok: Tokenizer = (open_tokenizer(server=tokenizer)
                          if tokenizer and tokenizer.startswith(("http://", "https://"))
                          else open_tokenizer(directory=tokenizer))
    except AuditError as exc:
        raise ReportError(str(exc)) from None
    decoded = not isinstance(tok, NoTokenizer)
    index = PrefixIndex(block_size)
    positions: Counter[int] = Counter()
    examples: dict[int, tuple[Divergence, int]] = {}
    prompt = cacheable = seen = 0
    batch: list[LogRequest] = []

    def flush() -> None:
        nonlocal prompt, cacheable, seen
        for req, ids in zip(batch, tok.tokenize(batch), strict=True):
            if isinstance(ids, str):
                continue
            result = index.add(ids, req.extra_keys)
            seen += 1
            prompt += result.prompt_tokens
            cacheable += result.cacheable_tokens
            div = result.divergence
            if div is not None and div.position / max(len(ids), 1) < OWN_CONTENT_SHARE:
                positions[div.position] += 1
                examples.setdefault(div.position, (div, len(ids)))
        batch.clear()

    for item in read_jsonl([path]):
        if seen + len(batch) >= max_requests:
            break
        if isinstance(item, LogRequest) and (decoded or item.token_ids is not None):
            batch.append(item)
            if len(batch) >= BATCH:
                flush()
    flush()
    achievable = cacheable / prompt if prompt else None
    for position, count in positions.most_common(8):
        div, length = examples[position]
        before = tok.decode(div.mine[:div.offset])
        shown = tok.decode(div.mine[max(0, div.offset - CONTEXT_TOKENS):div.offset])
        mine, theirs = tok.decode(div.mine[div.offset:]), tok.decode(div.theirs[div.offset:])
        kind = guess_kind(mine, theirs, before, position / length if length else None, decoded)
        if kind == OWN_CONTENT:
            continue
        return Finding(seen, achievable, position, count, kind,
                       f"{shown}⟦{mine}⟧ vs ⟦{theirs}⟧", FIXES[kind])
    return None
