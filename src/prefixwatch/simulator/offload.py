"""A host-memory KV tier behind the device pool, as vLLM's SimpleCPUOffloadConnector keeps it.

What vLLM does (vllm/v1/simple_kv_offload/manager.py, CPU backend, eager mode, the default):

* **Store when computed, not on eviction.** Once a request's blocks are confirmed computed
  (the step after its prefill), every full block not already in the host pool and not in
  flight is copied there, device hits included. A block already cached is skipped without
  refreshing its place in the LRU. The copy is asynchronous: the block becomes findable when
  the store completes (next step); until then it occupies a pinned host block
  (``pending_store_blocks``, ``used_blocks``).
* **LRU.** The host pool is a vLLM block pool of its own: a store takes a free block, else
  evicts the least recently released cached one; with every block pinned, the store stops.
* **Lookup after the device.** For a new request the connector looks up the blocks after the
  device hit, consecutive and capped like the device (``num_tokens - 1``, whole blocks). What it
  finds is loaded to the device: an external hit (``vllm:external_prefix_cache_hits``, and
  ``source="host"`` in the by-source counters); the request's ``cached_tokens`` include it.
  ``load_blocks`` counts the blocks when the load finishes (next step), which releases them
  to the LRU tail.

Simplified, stated: blocks filled during decode are not offloaded (vLLM's eager mode offloads
them too; they matter only when a later prompt repeats a generated answer); store outcomes
are not counted (vLLM 0.33 classifies only "boundary hand-off" stores, none on our workloads:
the family is declared, without samples, as on the fixture); a load costs
``1 / LOAD_SPEEDUP`` of recomputing the tokens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

#: Loading a token from host memory takes this many times less than recomputing it.
LOAD_SPEEDUP = 10.0


class HostTier:
    """One replica's host (CPU) KV pool of ``num_blocks`` blocks, keyed by block-hash chain."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError("the host tier needs at least 1 block")
        self.capacity = num_blocks
        self.block_size = block_size
        #: Blocks whose store completed, least recently released first (evicted from the head).
        self.cached: OrderedDict[int, None] = OrderedDict()
        self._in_flight: set[int] = set()  # stores issued, not complete: pinned
        self._store_batch: list[int] = []  # issued this step, complete at the next
        self._to_store: list[tuple[float, list[int]]] = []  # (confirmed at, keys) per request
        self._loading: list[int] = []  # loads issued at admission, finish at the next step
        # Counters, read by the metrics page.
        self.load_blocks = 0
        self.stored_blocks = 0
        self.evicted_blocks = 0

    # -- the page's gauges ---------------------------------------------------------------------

    @property
    def used_blocks(self) -> int:
        """Blocks pinned by in-flight stores and loads (vLLM's capacity minus free)."""
        return len(self._in_flight) + len(self._loading)

    @property
    def pending_store_blocks(self) -> int:
        return len(self._in_flight)

    @property
    def held_blocks(self) -> int:
        """Blocks holding data or reserved for it (SGLang's host used tokens / block size)."""
        return len(self.cached) + len(self._in_flight)

    # -- the connector's hooks -----------------------------------------------------------------

    def keys(self, tokens: Sequence[int], extra_keys: Hashable) -> list[int]:
        """The block-hash chain of the prompt's full blocks (extra keys seed it, as in vLLM)."""
        bs = self.block_size
        parent = hash(("prefixwatch-root", extra_keys))
        out = []
        for i in range(0, len(tokens) - len(tokens) % bs, bs):
            parent = hash((parent, tuple(tokens[i:i + bs])))
            out.append(parent)
        return out

    def admit(self, tokens: Sequence[int], extra_keys: Hashable, device_hit_tokens: int,
              computed_at: float) -> int:
        """Look up what follows the device hit, start its load; queue the prompt's stores for
        when its prefill is confirmed (``computed_at``). Returns the host-hit tokens."""
        keys = self.keys(tokens, extra_keys)
        start = device_hit_tokens // self.block_size
        limit = max(len(tokens) - 1, 0) // self.block_size
        hit = 0
        cached = self.cached
        for key in keys[start:limit]:
            if key not in cached:
                break
            hit += 1
        if hit:
            self._loading.extend(keys[start:start + hit])
        self._to_store.append((computed_at, keys))
        return hit * self.block_size

    def step(self, now: float) -> None:
        """One scheduler step: finish last step's loads and stores, issue the stores due."""
        cached = self.cached
        if self._loading:
            for key in self._loading:
                if key in cached:
                    cached.move_to_end(key)  # released to the LRU tail
            self.load_blocks += len(self._loading)
            self._loading = []
        if self._store_batch:
            for key in self._store_batch:
                self._in_flight.discard(key)
                cached[key] = None
            self.stored_blocks += len(self._store_batch)
            self._store_batch = []
        if not self._to_store:
            return
        due = [keys for at, keys in self._to_store if at <= now]
        if not due:
            return
        self._to_store = [(at, keys) for at, keys in self._to_store if at > now]
        pinned = set(self._loading)
        for keys in due:
            for key in keys:
                if key in cached or key in self._in_flight:
                    continue  # skipped: already cached (no LRU refresh) or in flight
                if not self._reserve(pinned):
                    break  # every host block pinned: the rest of this request is not stored
                self._in_flight.add(key)
                self._store_batch.append(key)

    def _reserve(self, pinned: set[int]) -> bool:
        """Make room for one block, evicting the least recently released cached one."""
        if len(self.cached) + len(self._in_flight) < self.capacity:
            return True
        for key in self.cached:
            if key not in pinned:
                del self.cached[key]
                self.evicted_blocks += 1
                return True
        return False

    def reset(self) -> None:
        """A restart: the host pool is process memory, it goes with the process."""
        self.__init__(self.capacity, self.block_size)  # type: ignore[misc]
