"""A host-memory KV tier behind the device pool, as vLLM's SimpleCPUOffloadConnector keeps it.

What vLLM does (vllm/v1/simple_kv_offload/manager.py, CPU backend, eager mode, the default):

* **Store what the step computes, not on eviction.** When a request is scheduled, every full
  prompt block not already in the host pool and not in flight is queued for a copy there,
  device hits included (a block already cached is skipped without refreshing its place in the
  LRU), and its device block is pinned (one more reference) until the copy completes. The copy
  is asynchronous: it completes in the first step after the request's prefill is done
  (``computed_at``); until then it occupies a pinned host block (``pending_store_blocks``,
  ``used_blocks``). Completion frees the pinned device blocks in prompt order, after the
  request freed its own reference tail first: so under pressure a stored prompt's device
  blocks are evicted first block first, as in vLLM's recorded event stream.
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

Blocks are keyed by the device pool's chained block ids, so the host tier's KV events
(``events``: medium ``CPU``, one ``BlockStored`` per block when its copy completes, a
``BlockRemoved`` when the host pool evicts it) name the same hashes as the device's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

from prefixwatch.core.cache.blockcache import block_ids, root_id

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
        # Stores in flight: (complete at, key, parent key, block tokens, extra keys, device
        # block pinned or -1), in issue order; those issued this step wait for the next one.
        self._stores: list[tuple[float, int, int | None, Sequence[int], Hashable, int]] = []
        self._new_stores: list[tuple[float, int, int | None, Sequence[int], Hashable, int]] = []
        #: The device pool whose blocks a store pins (a BlockPool); None pins nothing.
        self.device: Any = None
        #: Where the host pool's KV events go (a KVEventSink); None when off.
        self.events: Any = None
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

    @property
    def busy(self) -> bool:
        """Stores or loads still to issue or to complete (the connector has work in flight)."""
        return bool(self._stores or self._new_stores or self._loading)

    # -- the connector's hooks -----------------------------------------------------------------

    def keys(self, tokens: Sequence[int], extra_keys: Hashable) -> list[int]:
        """The block-hash chain of the prompt's full blocks (extra keys seed it, as in vLLM):
        the device pool's chained ids, so both tiers name a block alike."""
        return block_ids(tokens, self.block_size, root_id(extra_keys))

    def admit(self, tokens: Sequence[int], extra_keys: Hashable, device_hit_tokens: int,
              computed_at: float, device_blocks: Sequence[int] = ()) -> int:
        """Look up what follows the device hit and start its load; issue the prompt's stores
        (pinning ``device_blocks``, the request's device blocks in prompt order), to complete
        once its prefill is done (``computed_at``). Returns the host-hit tokens."""
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
        self._issue(computed_at, keys, tokens, extra_keys, device_blocks)
        return hit * self.block_size

    def _issue(self, at: float, keys: list[int], tokens: Sequence[int], extra_keys: Hashable,
               device_blocks: Sequence[int]) -> None:
        cached = self.cached
        pinned = set(self._loading)
        bs = self.block_size
        pins = []
        for i, key in enumerate(keys):
            if key in cached or key in self._in_flight:
                continue  # skipped: already cached (no LRU refresh) or in flight
            if not self._reserve(pinned):
                break  # every host block pinned: the rest of this request is not stored
            self._in_flight.add(key)
            block = device_blocks[i] if i < len(device_blocks) else -1
            if block >= 0:
                pins.append(block)
            self._new_stores.append((at, key, keys[i - 1] if i else None,
                                     tokens[i * bs:(i + 1) * bs], extra_keys, block))
        if pins and self.device is not None:
            self.device.hold(pins)

    def step(self, now: float) -> None:
        """One scheduler step: finish last step's loads, complete the stores that are due."""
        cached = self.cached
        if self._loading:
            for key in self._loading:
                if key in cached:
                    cached.move_to_end(key)  # released to the LRU tail
            self.load_blocks += len(self._loading)
            self._loading = []
        events = self.events
        if self._stores:
            done = [s for s in self._stores if s[0] <= now]
            if done:
                self._stores = [s for s in self._stores if s[0] > now]
                unpin = []
                for _, key, parent, block_tokens, extra_keys, block in done:
                    self._in_flight.discard(key)
                    cached[key] = None
                    if events is not None:
                        events.stored_host(parent, key, block_tokens, extra_keys)
                    if block >= 0:
                        unpin.append(block)
                self.stored_blocks += len(done)
                if unpin and self.device is not None:
                    self.device.release(unpin[::-1])  # release() frees tail first
        if self._new_stores:
            self._stores += self._new_stores
            self._new_stores = []

    def _reserve(self, pinned: set[int]) -> bool:
        """Make room for one block, evicting the least recently released cached one."""
        if len(self.cached) + len(self._in_flight) < self.capacity:
            return True
        for key in self.cached:
            if key not in pinned:
                del self.cached[key]
                self.evicted_blocks += 1
                if self.events is not None:
                    self.events.removed(key, "CPU")
                return True
        return False

    def reset(self) -> None:
        """A restart: the host pool is process memory, it goes with the process."""
        events, device = self.events, self.device
        self.__init__(self.capacity, self.block_size)  # type: ignore[misc]
        self.events, self.device = events, device
