"""One pass over a request log: what a prefix cache could serve, and where prompts diverge.

Linear in the total number of tokens: every earlier request goes into the one prefix index
(``core.prefixindex``, an exact radix tree over token ids), so each request is matched against
all earlier ones at once, never pairwise, with C-level slice comparisons and no hashing:
``benchmarks/bench_audit.py`` measures it against the runbook's per-block hashing loop.

- ``cacheable_tokens``: what an unlimited cache would serve a request, vLLM's rule (whole
  blocks, within the first n - 1 tokens, same extra keys). Only prompts are known here, so
  blocks of generated output that a multi-turn follow-up could reuse are not counted.
- divergence: the position of a request's longest common prefix with any earlier request
  (same extra keys), exact to the token, where both have a token and they differ; the example
  shows the most recent earlier request that differs there.
- with a KV pool of N blocks, the same log replayed through the simulator's LRU block pool.

SGLang's rule (``engine="sglang"``) is the same formula at its granularity: a page of
``page_size`` tokens (1 by default: token by token) where vLLM has a block, still within the
first n - 1 tokens (``core/cache/radixcache.py``); its pool replay is SGLang's radix cache, LRU over
unreferenced leaves.
"""

from __future__ import annotations

import gc
from array import array
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from prefixwatch.core.cache.prefixindex import (
    CONTEXT_TOKENS,
    Divergence,
    PrefixIndex,
    RequestResult,
)
from prefixwatch.core.cache.requestledger import Ledger
from prefixwatch.core.cache.whatvaries import FIXES, guess_kind, value_start
from prefixwatch.core.kv.poolcurve import PoolCurve, curve_of
from prefixwatch.core.kv.whatif import POOL_SCALES
from prefixwatch.core.logs.tokenids import packed_ids

MAX_EXAMPLES = 64


class LruReplay:
    """The same log through a KV pool of N blocks with vLLM's eviction order."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        from prefixwatch.core.cache.blockcache import BlockPool  # only with --kv-blocks

        self.pool = BlockPool(num_blocks, block_size)

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None) -> int:
        admitted = self.pool.admit(tokens, extra_keys)
        if admitted is None:
            return 0  # the prompt does not fit in the pool at all
        self.pool.release(admitted.blocks)
        return admitted.cached_tokens


class RadixReplay:
    """The same log through SGLang's radix cache of ``num_pages`` pages (its eviction)."""

    def __init__(self, num_pages: int, page_size: int) -> None:
        from prefixwatch.core.cache.radixcache import RadixCache, max_prefix_tokens

        self.cache = RadixCache(num_pages * page_size, page_size)
        self._cap = max_prefix_tokens

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None) -> int:
        cache = self.cache
        matched, node = cache.match(tokens[:self._cap(len(tokens))], extra_keys)
        cache.lock(node)
        ps = cache.page_size
        held = -(-(len(tokens) - matched) // ps) * ps
        if not cache.allocate(held):
            cache.unlock(node)
            return 0  # the prompt does not fit in the pool at all
        present, _ = cache.insert(tokens, extra_keys)
        # The tree keeps what it did not hold; the copies and the partial page are freed.
        cache.release(held - (len(tokens) // ps * ps - present))
        cache.unlock(node)
        return matched


@dataclass
class Report:
    block_size: int
    requests: int = 0
    prompt_tokens: int = 0
    cacheable_tokens: int = 0
    simulated_cached_tokens: int = 0
    kv_blocks: int | None = None
    #: Whose rule: "vllm" (blocks of block_size) or "sglang" (pages of block_size tokens).
    engine: str = "vllm"
    #: The same log through pools ``pool_scale`` times ``kv_blocks`` (the pool curve).
    scaled_cached_tokens: dict[str, int] = field(default_factory=dict)
    bad_lines: list[tuple[str, str]] = field(default_factory=list)
    positions: Counter = field(default_factory=Counter)
    examples: dict[int, Divergence] = field(default_factory=dict)
    #: The prompt length of each example, to tell a divergence near the top from the start
    #: of the request's own content (core/cache/whatvaries.py).
    example_tokens: dict[int, int] = field(default_factory=dict)

    @property
    def achievable_hit_rate(self) -> float | None:
        return self.cacheable_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def simulated_hit_rate(self) -> float | None:
        if self.kv_blocks is None or not self.prompt_tokens:
            return None
        return self.simulated_cached_tokens / self.prompt_tokens

    def pool_curve(self) -> PoolCurve | None:
        """The replayed hit ratio at ``kv_blocks`` and at each larger pool (None: no replay
        at several sizes)."""
        if self.simulated_hit_rate is None or not self.scaled_cached_tokens:
            return None
        gained = {s: n - self.simulated_cached_tokens
                  for s, n in self.scaled_cached_tokens.items()}
        return curve_of(self.prompt_tokens, self.simulated_cached_tokens, gained)

    def top_divergences(self, decode: Callable[[Sequence[int]], str], limit: int = 10,
                        redact: bool = False, decoded: bool = True) -> list[dict]:
        """The most frequent divergence positions; ``decoded=False`` when ``decode`` only
        joins token ids (no tokenizer), so the kind is not guessed from digits."""
        out = []
        for position, count in self.positions.most_common(limit):
            ex = self.examples[position]
            before = decode(ex.mine[:ex.offset])
            shown = decode(ex.mine[max(0, ex.offset - CONTEXT_TOKENS):ex.offset])
            mine_after = decode(ex.mine[ex.offset:])
            theirs_after = decode(ex.theirs[ex.offset:])
            length = self.example_tokens.get(position)
            shared = position / length if length else None
            kind = guess_kind(mine_after, theirs_after, before, shared, decoded)
            context = "[redacted]" if redact else f"{shown}⟦{mine_after}⟧ vs ⟦{theirs_after}⟧"
            starts = position - value_start(kind, ex.mine[:ex.offset], lambda t: decode([t]))
            out.append({"position": position, "starts_at": starts, "count": count, "kind": kind,
                        "context": context, "fix": FIXES[kind]})
        return out


class Auditor:
    """Feeds tokenized requests, in log order, to the analyses.

    Token ids are held packed (``array('I')``: 4 bytes a token, slices compared in C), as
    the log reader hands them over.

    The index holds long-lived nodes (and their dicts of children) that Python's cyclic
    garbage collector would rescan as the log grows; they live as long as the audit, so they
    are moved out of its way (``gc.freeze``) every ``FREEZE_EVERY`` requests, often enough
    that a young collection (700 new containers) never starts in between.
    """

    FREEZE_EVERY = 64

    def __init__(self, block_size: int = 16, kv_blocks: int | None = None,
                 engine: str = "vllm", pool_curve: bool = True) -> None:
        if block_size < 1:
            raise ValueError("block size must be at least 1")
        self.index = PrefixIndex(block_size, packed=True)
        replay = RadixReplay if engine == "sglang" else LruReplay
        self.replay = replay(kv_blocks, block_size) if kv_blocks else None
        #: The pool curve: the same log through pools 1.25, 1.5, 2 and 4 times larger.
        self.scaled = ({s: replay(round(kv_blocks * float(s)), block_size)
                        for s in POOL_SCALES} if kv_blocks and pool_curve else {})
        self.report = Report(block_size, kv_blocks=kv_blocks, engine=engine)
        #: The hit-rate ledger over the same index (core/cache/requestledger.py); the pool
        #: part with
        #: ``kv_blocks``, the routing part when requests name their replica.
        self.ledger = Ledger(block_size, (lambda _replica: kv_blocks) if kv_blocks else None)

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None,
            replica: str | None = None, cached: int | None = None,
            output: int | None = None) -> RequestResult:
        """Replay one request (ValueError, nothing counted, for a token id beyond 32 bits)."""
        if not (isinstance(tokens, array) and tokens.typecode == "I"):
            tokens = packed_ids(tokens)  # a tokenizer's list; a log's ids come packed
        result = self.index.add(tokens, extra_keys)
        self.ledger.account(self.index, tokens, extra_keys, result, result.divergence, replica,
                            cached, output=output)
        r = self.report
        r.requests += 1
        if r.requests % self.FREEZE_EVERY == 0:
            gc.freeze()
        r.prompt_tokens += result.prompt_tokens
        r.cacheable_tokens += result.cacheable_tokens
        if self.replay is not None:
            result.simulated_cached_tokens = self.replay.add(tokens, extra_keys)
            r.simulated_cached_tokens += result.simulated_cached_tokens
            scaled = r.scaled_cached_tokens
            for scale, replay in self.scaled.items():
                scaled[scale] = scaled.get(scale, 0) + replay.add(tokens, extra_keys)
        if result.divergence is not None:
            pos = result.divergence.position
            r.positions[pos] += 1
            if pos not in r.examples:
                if len(r.examples) >= MAX_EXAMPLES * 16:
                    # Keep the examples of the frequent positions; rare ones make room (and
                    # get an example again the next time they occur).
                    keep = {p for p, _ in r.positions.most_common(MAX_EXAMPLES * 8)}
                    r.examples = {p: ex for p, ex in r.examples.items() if p in keep}
                    r.example_tokens = {p: n for p, n in r.example_tokens.items()
                                        if p in keep}
                r.examples[pos] = result.divergence
                r.example_tokens[pos] = result.prompt_tokens
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
