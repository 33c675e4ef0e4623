"""One simulated SGLang replica: the engine's scheduler loop over SGLang's radix cache.

The timing model is the vLLM engine's (``engine.py``); what differs is how the KV cache is
kept, as SGLang keeps it (``core/cache/radixcache.py``, SGLang's ``schedule_batch.py`` and its
scheduler's output processing):

* A request looks up its first ``len - 1`` prompt tokens, token by token (``--page-size`` 1)
  or a page at a time, and references the node the match ends at (``inc_lock_ref``). Its
  ``cached_tokens`` are the matched tokens, plus what the HiCache host pool serves after them.
* SGLang's scheduler admits a request only when the pool (free slots and what eviction can
  free) holds its new tokens and room for its answer; the simulator reserves the answer whole
  at admission (SGLang reserves a share of it, ``new_token_ratio``, and retracts a running
  request when decode runs short), so it never retracts.
* After the prefill, the prompt (whole pages) goes into the tree (``cache_unfinished_req``);
  when the request finishes, the prompt and the answer but its last token
  (``cache_finished_req``), and the reference is dropped. What the tree already held is freed,
  not stored twice.
* The ``/metrics`` counters move when a request finishes (SGLang's tokenizer manager counts
  prompt, generated and cached tokens then); the hit-rate gauge is the last prefill batch's
  cached share, the token usage ``(capacity - free - evictable) / capacity``.

``--kv-blocks`` keeps its meaning in tokens: the pool holds ``kv_blocks × block_size`` tokens,
in pages of ``page_size``; the host pool (``--offload-blocks``) likewise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence

from prefixwatch.core.cache.radixcache import (
    RadixCache,
    max_prefix_tokens,
    namespace_seed,
    page_hash,
    signed64,
)
from prefixwatch.simulator.engine import Engine, EngineConfig, PrefixStore, SimRequest
from prefixwatch.simulator.offload import LOAD_SPEEDUP, HostTier


def page_keys(tokens: Sequence[int], page_size: int, extra_keys: Hashable) -> list[int]:
    """The hash SGLang publishes for each whole page of ``tokens`` (its chain from the start)."""
    prior = namespace_seed(extra_keys)
    out = []
    for i in range(0, len(tokens) // page_size * page_size, page_size):
        prior = page_hash(tokens[i:i + page_size], prior)
        out.append(signed64(prior))
    return out


class HiCacheHostPool(HostTier):
    """SGLang's HiCache host pool, by the host tier's rule (``offload.py``): written through as
    a request's prefill completes, looked up after the device's match (pages, the ``len - 1``
    cap), LRU. Its pages are keyed by the hashes SGLang publishes, so its ``CPU_PINNED`` events
    name the device's hashes."""

    def keys(self, tokens: Sequence[int], extra_keys: Hashable) -> list[int]:
        return page_keys(tokens, self.block_size, extra_keys)


class SGLangEngine(Engine):
    """An Engine whose KV cache is SGLang's radix cache (see the module docstring)."""

    def __init__(self, config: EngineConfig, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        super().__init__(config, clock)
        ps = config.page_size
        if ps < 1:
            raise ValueError("page_size must be at least 1")
        self.cache = RadixCache(config.num_blocks * config.block_size, ps,
                                config.enable_prefix_caching)
        self.offload = (HiCacheHostPool(max(config.offload_blocks * config.block_size // ps, 1),
                                        ps) if config.offload_blocks else None)
        self._batch = [0, 0]  # this step's prefill batch: cached tokens, prompt tokens

    @property
    def prefix_store(self) -> PrefixStore:
        """SGLang caches prompts in its radix tree, not in vLLM's block pool."""
        return self.cache

    def _check_fits(self, tokens: int) -> None:
        needed = -(-tokens // self.cache.page_size) * self.cache.page_size
        if needed > self.cache.capacity:
            raise ValueError(f"the request needs {needed} KV slots; the pool has "
                             f"{self.cache.capacity}")

    # -- scheduling ----------------------------------------------------------------------------

    def _admit(self, now: float) -> None:
        cfg = self.config
        cache = self.cache
        self._batch = [0, 0]
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            tokens = req.prompt
            n = len(tokens)
            matched, node = cache.match(tokens[:max_prefix_tokens(n, 1)], req.extra_keys)
            cache.lock(node)
            need = n + req.max_tokens - matched
            if not cache.allocate(need):
                cache.unlock(node)
                break  # wait for running requests to finish and free their slots
            self.waiting.popleft()
            req.radix_node, req.radix_inserted = node, matched
            req.radix_held = -(-need // cache.page_size) * cache.page_size
            uncached = n - matched
            host_tokens = 0
            if self.offload is not None:
                start = max(now, self._prefill_free_at)
                host_tokens = self.offload.admit(tokens, req.extra_keys, matched, start + (
                    uncached / cfg.prefill_tokens_per_s) + cfg.base_latency)
                uncached -= host_tokens - host_tokens / LOAD_SPEEDUP
            self._count_admission(req, n, matched, host_tokens, now)
            start = max(now, self._prefill_free_at)
            self._prefill_free_at = start + uncached / cfg.prefill_tokens_per_s
            req.first_token_at = self._prefill_free_at + cfg.base_latency
            req.output.append(self._next_token(req))
            req.decode_started = req.first_token_at
            self.running.append(req)
            self.stats.emit("scheduled", req)

    def _count_admission(self, req: SimRequest, n: int, device: int, host: int,
                         now: float) -> None:
        st = self.stats
        st.prefix_queries += n
        st.prefix_hits += device
        st.prompt_tokens += n
        st.prompt_tokens_cached += device + host
        if self.offload is not None:
            st.ext_queries += n - device
            st.ext_hits += host
        st.requests += 1
        self._batch[0] += device + host
        self._batch[1] += n
        # SGLang's gauge: the prefill batch's cached tokens over its cached and new tokens.
        st.last_batch_hit_rate = self._batch[0] / self._batch[1]
        req.cached_tokens = device + host
        req.external_cached_tokens = host
        req.scheduled_at = now

    def _advance(self, now: float) -> None:
        cfg = self.config
        for req in list(self.running):
            if req.decode_started is None or now < req.decode_started:
                continue
            if req.radix_inserted < len(req.prompt) // self.cache.page_size * \
                    self.cache.page_size:
                self._insert(req, req.prompt)  # the prefill is done: others can match it
            target = min(req.max_tokens,
                         1 + int((now - req.decode_started) / cfg.time_per_output_token))
            before = len(req.output)
            while len(req.output) < target:
                req.output.append(self._next_token(req))
            if len(req.output) > before:
                self.stats.emit("generated", req)
            if len(req.output) >= req.max_tokens:
                finished = req.decode_started + (req.max_tokens - 1) * cfg.time_per_output_token
                self._finish(req, max(finished, req.first_token_at or now), "length")

    def _insert(self, req: SimRequest, tokens: Sequence[int]) -> None:
        """Put what the request computed into the tree; free its copy of what was there."""
        cache = self.cache
        if not cache.enable_caching:
            return  # --disable-radix-cache: the request keeps its slots until it finishes
        present, node = cache.insert(tokens, req.extra_keys)
        aligned = len(tokens) // cache.page_size * cache.page_size
        if aligned <= req.radix_inserted:
            return
        cache.release(present - req.radix_inserted)  # duplicates of what the tree held
        req.radix_held -= aligned - req.radix_inserted
        req.radix_inserted = aligned
        cache.lock(node)
        cache.unlock(req.radix_node)
        req.radix_node = node

    def _free(self, req: SimRequest) -> None:
        """``cache_finished_req``: the prompt and the answer but its last sampled token (which
        has no KV) into the tree, the reference dropped, the rest of the slots freed."""
        self._insert(req, req.prompt + req.output[:-1])
        self.cache.unlock(req.radix_node)
        self.cache.release(req.radix_held)
        req.radix_node, req.radix_held = None, 0

    # -- operations ----------------------------------------------------------------------------

    def restart(self) -> None:
        with self.lock:
            super().restart()
            if self.kv_events is not None:
                self.kv_events.sink.cleared()  # SGLang's reset publishes AllBlocksCleared
