"""One pass over a request log: what a prefix cache could serve, and where prompts diverge.

Linear in the total number of tokens: every earlier request's full blocks go into a trie keyed
by token blocks (one dict look-up per block, the same identity as vLLM's chained block
hashes), so each request is matched against all earlier ones at once, never pairwise.

- ``cacheable_tokens``: what an unlimited cache would serve a request, vLLM's rule (whole
  blocks, within the first n - 1 tokens, same extra keys). Only prompts are known here, so
  blocks of generated output that a multi-turn follow-up could reuse are not counted.
- divergence: the position of a request's longest common prefix with any earlier request,
  exact to the token (the diverging block is compared with the 32 most recent earlier blocks
  that follow the same prefix, where the variable part nearly always differs least).
- with a KV pool of N blocks, the same log replayed through the simulator's LRU block pool.
"""

from __future__ import annotations

import gc
import re
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ..simulator.kvcache import BlockPool, cached_tokens_for

RECENT_SIBLINGS = 32
CONTEXT_TOKENS = 12
MAX_EXAMPLES = 64


@dataclass
class Divergence:
    position: int
    mine: tuple[int, ...]  # this request's tokens around the position
    theirs: tuple[int, ...]  # the closest earlier request's tokens from the same start
    offset: int  # index of the position inside `mine`


@dataclass
class RequestResult:
    prompt_tokens: int
    cacheable_tokens: int
    divergence: Divergence | None
    simulated_cached_tokens: int | None = None


class PrefixIndex:
    """Every earlier request's full blocks, as a trie per extra-key set."""

    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.roots: dict[Hashable, dict] = {}
        self.blocks = 0

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None) -> RequestResult:
        bs = self.bs
        n = len(tokens)
        t = tuple(tokens)
        full = n - n % bs
        root = self.roots.get(extra_keys)
        seen_before = root is not None
        if root is None:
            root = self.roots[extra_keys] = {}
        node = root
        matched = 0
        for start in range(0, full, bs):
            child = node.get(t[start:start + bs])
            if child is None:
                break
            node = child
            matched += 1
        cacheable = cached_tokens_for(n, matched, bs)
        divergence = self._divergence(t, node, matched) if seen_before else None
        # Insert the rest of this request's full blocks, and its partial tail: the tail is
        # never a cache hit (a lookup asks for full blocks only) but later requests measure
        # their common prefix against it.
        for start in range(matched * bs, full, bs):
            child: dict = {}
            node[t[start:start + bs]] = child
            node = child
            self.blocks += 1
        if full < n:
            node.setdefault(t[full:], {})
        return RequestResult(n, cacheable, divergence)

    def _divergence(self, t: tuple[int, ...], node: dict, matched: int) -> Divergence | None:
        bs = self.bs
        start = matched * bs
        if start >= len(t):
            return None  # every full block matched and nothing is left: no divergence
        rest = t[start:start + bs]

        def common(key: tuple[int, ...]) -> int:
            n = 0
            for a, b in zip(rest, key, strict=False):
                if a != b:
                    break
                n += 1
            return n

        best, best_key = closest_sibling(reversed(node), common)
        if best_key is None:
            return None  # earlier requests ended here: this one extends them, nothing differs
        return divergence_at(t, start, len(rest), bs, best, tuple(best_key))


K = TypeVar("K")


def closest_sibling(siblings: Iterable[K], common: Callable[[K], int]) -> tuple[int, K | None]:
    """Of the RECENT_SIBLINGS most recent earlier blocks that follow the same prefix (newest
    first), the one sharing the longest start with this request's diverging block."""
    best, best_key = 0, None
    for i, key in enumerate(siblings):
        if i >= RECENT_SIBLINGS:
            break
        shared = common(key)
        if shared > best or best_key is None:
            best, best_key = shared, key
    return best, best_key


def divergence_at(tokens: Sequence[int], start: int, rest: int, block_size: int, best: int,
                  theirs_block: tuple[int, ...]) -> Divergence | None:
    """The divergence ``best`` tokens into the block at ``start`` (``rest`` tokens of this
    request from there), with the context on both sides."""
    if best == rest and rest < block_size:
        return None  # a shorter prompt that an earlier one continues: nothing differs
    position = start + best
    lo = max(0, position - CONTEXT_TOKENS)
    mine = tuple(tokens[lo:position + CONTEXT_TOKENS])
    theirs = tuple(tokens[lo:start]) + theirs_block
    return Divergence(position, mine, theirs, position - lo)


class LruReplay:
    """The same log through a KV pool of N blocks with vLLM's eviction order."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.pool = BlockPool(num_blocks, block_size)

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None) -> int:
        admitted = self.pool.admit(tokens, extra_keys)
        if admitted is None:
            return 0  # the prompt does not fit in the pool at all
        self.pool.release(admitted.blocks)
        return admitted.cached_tokens


# -- what varies ---------------------------------------------------------------------------------

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}|\d{1,2}:\d{2}(:\d{2})?|\b(19|20)\d{2}\b|"
                   r"\b(Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\b|\b(Jan|Feb|Mar|Apr|May|Jun|Jul|"
                   r"Aug|Sep|Oct|Nov|Dec)[a-z]*\b", re.I)
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}|[0-9a-f]{12,}|\b[0-9a-f]{6,}\b", re.I)
_KEY = re.compile(r'"([^"\\]{1,64})"\s*:')
_NAME = re.compile(r"\b[A-Z][a-z]+ [A-Z][a-z]+\b")

FIXES = {
    "date/time": "Move the date or time out of the prefix: put it in the user turn or a last "
                 "system line, or round it (a date, not a timestamp); check the chat template "
                 "does not inject today's date.",
    "id": "Remove request, trace or user ids from the prompt, or move them to the end; pass "
          "them as metadata instead.",
    "key order": "Serialise tools and JSON with a fixed key and tool order "
                 "(json.dumps(..., sort_keys=True), tools sorted by name).",
    "number": "A number changes near the top (a counter, a price, an order number): move it "
              "after the stable instructions.",
    "name": "A user or customer name in the prefix: move personalisation after the shared "
            "instructions.",
    "text": "Text varies here (RAG passages, few-shot examples, per-user instructions): put the "
            "stable instructions, tools and examples first and the variable text last.",
}


def guess_kind(mine: str, theirs: str, before: str = "") -> str:
    """What varies where two prompts diverge: the text right after the divergence, joined to
    the rest of its line before it (a timestamp often diverges in its last digits)."""
    line = before.rsplit("\n", 1)[-1][-32:]
    mine = line + mine.split("\n", 1)[0][:48]
    theirs = line + theirs.split("\n", 1)[0][:48]
    if _DATE.search(mine) and _DATE.search(theirs):
        return "date/time"
    keys_a, keys_b = _KEY.findall(mine), _KEY.findall(theirs)
    if keys_a and keys_b and keys_a != keys_b and set(keys_a) & set(keys_b):
        return "key order"
    if keys_a and keys_b and keys_a[:1] != keys_b[:1]:
        return "key order"
    if _ID.search(mine) and _ID.search(theirs):
        return "id"
    if re.search(r"\d", mine) and re.search(r"\d", theirs):
        return "number"
    if _NAME.search(mine) and _NAME.search(theirs) and _NAME.findall(mine) != _NAME.findall(
            theirs):
        return "name"
    return "text"


@dataclass
class Report:
    block_size: int
    requests: int = 0
    prompt_tokens: int = 0
    cacheable_tokens: int = 0
    simulated_cached_tokens: int = 0
    kv_blocks: int | None = None
    bad_lines: list[tuple[str, str]] = field(default_factory=list)
    positions: Counter = field(default_factory=Counter)
    examples: dict[int, Divergence] = field(default_factory=dict)

    @property
    def achievable_hit_rate(self) -> float | None:
        return self.cacheable_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def simulated_hit_rate(self) -> float | None:
        if self.kv_blocks is None or not self.prompt_tokens:
            return None
        return self.simulated_cached_tokens / self.prompt_tokens

    def top_divergences(self, decode: Callable[[Sequence[int]], str], limit: int = 10,
                        redact: bool = False) -> list[dict]:
        out = []
        for position, count in self.positions.most_common(limit):
            ex = self.examples[position]
            before = decode(ex.mine[:ex.offset])
            mine_after = decode(ex.mine[ex.offset:])
            theirs_after = decode(ex.theirs[ex.offset:])
            kind = guess_kind(mine_after, theirs_after, before)
            context = "[redacted]" if redact else f"{before}⟦{mine_after}⟧ vs ⟦{theirs_after}⟧"
            out.append({"position": position, "count": count, "kind": kind,
                        "context": context, "fix": FIXES[kind]})
        return out


class Auditor:
    """Feeds tokenized requests, in log order, to the analyses.

    The index holds millions of long-lived dicts and tuples that Python's cyclic garbage
    collector would rescan again and again as the log grows; they form no cycles, so they are
    moved out of its way (``gc.freeze``) every ``FREEZE_EVERY`` requests.
    """

    FREEZE_EVERY = 512

    def __init__(self, block_size: int = 16, kv_blocks: int | None = None) -> None:
        if block_size < 1:
            raise ValueError("block size must be at least 1")
        self.index = PrefixIndex(block_size)
        self.replay = LruReplay(kv_blocks, block_size) if kv_blocks else None
        self.report = Report(block_size, kv_blocks=kv_blocks)

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None) -> RequestResult:
        result = self.index.add(tokens, extra_keys)
        r = self.report
        r.requests += 1
        if r.requests % self.FREEZE_EVERY == 0:
            gc.freeze()
        r.prompt_tokens += result.prompt_tokens
        r.cacheable_tokens += result.cacheable_tokens
        if self.replay is not None:
            result.simulated_cached_tokens = self.replay.add(tokens, extra_keys)
            r.simulated_cached_tokens += result.simulated_cached_tokens
        if result.divergence is not None:
            pos = result.divergence.position
            r.positions[pos] += 1
            if pos not in r.examples:
                if len(r.examples) >= MAX_EXAMPLES * 16:
                    # Keep the examples of the frequent positions; rare ones make room (and
                    # get an example again the next time they occur).
                    keep = {p for p, _ in r.positions.most_common(MAX_EXAMPLES * 8)}
                    r.examples = {p: ex for p, ex in r.examples.items() if p in keep}
                r.examples[pos] = result.divergence
        return result


def diff(a: Sequence[int], b: Sequence[int], block_size: int) -> dict:
    """The runbook's two-request view: where B stops matching A, and what B could reuse."""
    common = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        common += 1
    reusable = min(common // block_size, max(len(b) - 1, 0) // block_size)
    return {"first_divergent_token": common if common < max(len(a), len(b)) else None,
            "reusable_blocks": reusable, "blocks": len(b) // block_size,
            "common_prefix_tokens": common}
