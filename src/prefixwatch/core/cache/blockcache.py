"""vLLM V1's automatic prefix caching, reproduced block for block.

The rule (vllm/v1/core/kv_cache_manager.py, block_pool.py, single_type_kv_cache_manager.py):

* A prompt is cut into blocks of ``block_size`` tokens; only full blocks are cached.
* A block's identity covers its parent's identity, its tokens and the request's extra keys
  (LoRA adapter, cache_salt, multimodal hashes): the first differing token ends reuse.
  Here it is a 64-bit id chained over the prompt as vLLM chains block hashes:
  ``id(k) = id(k - 1) + hash(block k) * W[k]  (mod 2**64)`` from a root id that stands for
  the extra keys, ``hash`` CPython's tuple hash of the block's token ids (deterministic for
  ints) and ``W`` fixed random odd weights: one numpy cumulative sum per prompt
  (``block_ids``). Two prefixes share an id with probability about 2**-64 per pair. The pool
  keys its cached blocks by these ids, as vLLM keys ``cached_block_hash_to_block``.
* A lookup takes the longest run of cached blocks within the first ``num_tokens - 1`` tokens
  (the last prompt token is always recomputed to get logits), in whole blocks.
* Blocks are reference-counted. A freed block stays cached in the free queue; new blocks come
  from the head of that queue (least recently freed first), evicting what they cached. A
  request frees its blocks tail first, so a prompt's last blocks go before its first ones.
  Several physical blocks may cache the same identity (two requests computed it at once).
* Optional event hooks (``BlockPool.events``) report what vLLM's KV event stream reports:
  blocks cached (once per request and caching call, with the parent's id) and cached blocks
  evicted when reused; freeing a block reports nothing.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Protocol

from prefixwatch.core.cache.cacherule import cached_tokens_for

if TYPE_CHECKING:
    import numpy as np

MASK = (1 << 64) - 1
_WEIGHT_CHUNK = 4096
_SEED = 0x5EED_B10C
#: Grown on first use; numpy is imported then, so an audit without --kv-blocks never loads it.
_weights: np.ndarray | None = None
_weights_lock = threading.Lock()


def _weights_for(n: int) -> np.ndarray:
    """The first ``n`` chain weights; the same on every run (grown in seeded chunks)."""
    import numpy as np

    global _weights
    w = _weights
    if w is None or len(w) < n:
        with _weights_lock:
            w = _weights if _weights is not None else np.zeros(0, dtype=np.uint64)
            chunks = [w]
            for c in range(len(w) // _WEIGHT_CHUNK, -(-n // _WEIGHT_CHUNK)):
                rng = np.random.default_rng([_SEED, c])
                chunk = rng.integers(0, 2**64, size=_WEIGHT_CHUNK, dtype=np.uint64)
                chunks.append(chunk | np.uint64(1))
            w = _weights = np.concatenate(chunks)
    return w[:n]


def root_id(extra_keys: Hashable) -> int:
    """The id a chain starts from: the extra keys (None for a plain request)."""
    return hash(("prefixwatch-root", extra_keys)) & MASK


def block_ids(tokens: Sequence[int], block_size: int, root: int) -> list[int]:
    """The chained id of every full block of ``tokens`` (a prompt, from its start)."""
    n = len(tokens) // block_size
    if n == 0:
        return []
    import numpy as np

    # zip hands out one reused tuple per block when nothing keeps it: no allocation.
    blocks = zip(*[iter(tokens)] * block_size, strict=False)
    h = np.fromiter(map(hash, blocks), dtype=np.int64, count=n).view(np.uint64)
    h *= _weights_for(n)
    np.cumsum(h, out=h)
    h += np.uint64(root)
    return h.tolist()


def child_id(parent: int, depth: int, block: tuple[int, ...]) -> int:
    """The id of ``block`` at 0-based position ``depth`` after ``parent``: one chain step,
    equal to what ``block_ids`` computes for the whole prompt."""
    weight = int(_weights_for(depth + 1)[depth])
    return (parent + (hash(block) & MASK) * weight) & MASK


__all__ = ["Admission", "BlockEvents", "BlockPool", "NoFreeBlocks", "Node", "Residency",
           "block_ids", "cached_tokens_for", "child_id", "root_id"]


class Node:
    """One block identity (a chained id from the prefix index) and the blocks caching it."""

    __slots__ = ("blocks", "children", "depth", "id", "key", "parent")

    def __init__(self, parent: Node | None, block_id: int, depth: int, key: Hashable) -> None:
        self.parent = parent
        self.id = block_id
        self.depth = depth  # 0 for a prompt's first block, -1 for a root
        self.key = key  # the extra keys for a root
        self.children = 0  # identities held after this one
        self.blocks: list[int] = []  # physical blocks caching this identity


class Admission:
    """What admitting a prompt did: tokens served from cache, blocks held, cached path."""

    __slots__ = ("blocks", "cached_tokens", "path")

    def __init__(self, cached_tokens: int, blocks: list[int], path: list[Node]) -> None:
        self.cached_tokens = cached_tokens
        self.blocks = blocks
        self.path = path


class Residency:
    """vLLM's ``--kv-cache-metrics`` (v1/core/kv_cache_metrics.py): a sampled share of blocks is
    tracked from allocation; a prefix-cache hit is an access; when a block's cached content is
    evicted, its lifetime, its idle time since the last access and the gaps between its last
    accesses (a ring of 4) are reported to the listeners."""

    def __init__(self, clock: Callable[[], float], sample_rate: float = 0.01,
                 seed: int = 0) -> None:
        self.clock = clock
        self.sample_rate = min(max(sample_rate, 0.0), 1.0)
        self._rng = random.Random(seed)
        self._state: dict[int, tuple[float, deque[float]]] = {}
        self._last: dict[int, float] = {}
        self.listeners: list[Callable[[float, float, list[float]], None]] = []

    def allocated(self, block: int) -> None:
        if self._rng.random() < self.sample_rate:
            now = self.clock()
            self._state[block] = (now, deque(maxlen=4))
            self._last[block] = now
        else:
            self._state.pop(block, None)
            self._last.pop(block, None)

    def accessed(self, block: int) -> None:
        state = self._state.get(block)
        if state is not None:
            now = self.clock()
            self._last[block] = now
            state[1].append(now)

    def evicted(self, block: int) -> None:
        state = self._state.pop(block, None)
        if state is None:
            return
        now = self.clock()
        birth, history = state
        last = self._last.pop(block, birth)
        times = list(history)
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        for listener in self.listeners:
            listener(now - birth, now - last, gaps)

    def reset(self) -> None:
        self._state.clear()
        self._last.clear()
        self.listeners.clear()


class BlockEvents(Protocol):
    """Who hears of the pool's stores and evictions (vLLM's BlockStored / BlockRemoved)."""

    def stored(self, parent_id: int | None, block_ids: Sequence[int], tokens: Sequence[int],
               extra_keys: Hashable = None, first_position: int = 0) -> None:
        """``block_ids`` were cached after ``parent_id`` (None at a prompt's start); ``tokens``
        are their token ids, the first block at 0-based block position ``first_position``."""

    def removed(self, block_id: int) -> None:
        """A cached block holding ``block_id`` was evicted (reused for other content)."""


def _parent_id(node: Node) -> int | None:
    """The id an event names as parent: None for a root (a prompt's start)."""
    return None if node.parent is None and node.depth < 0 else node.id


class NoFreeBlocks(Exception):
    """The pool cannot hand out the blocks asked for."""


class BlockPool:
    """A pool of ``num_blocks`` KV blocks with vLLM's free queue and prefix index.

    Like vLLM, block 0 is the reserved null block, so ``num_blocks - 1`` are usable.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError("the pool needs at least 2 blocks (one is the null block)")
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.node_of: list[Node | None] = [None] * num_blocks
        # Eviction order: head = next to be reused. Value unused.
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))
        self.roots: dict[Hashable, Node] = {}
        self.by_id: dict[int, Node] = {}
        self.evictions = 0
        #: Block-residency tracking (vLLM's --kv-cache-metrics); None when off.
        self.residency: Residency | None = None
        #: Store and eviction hooks (vLLM's KV event stream); None when off.
        self.events: BlockEvents | None = None

    # -- queries -------------------------------------------------------------------------------

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1

    @property
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        """vLLM's kv_cache_usage_perc: 1 - free / usable."""
        return 1.0 - self.num_free / self.usable_blocks

    def root(self, extra_keys: Hashable) -> Node:
        node = self.roots.get(extra_keys)
        if node is None:
            node = self.roots[extra_keys] = Node(None, root_id(extra_keys), -1, extra_keys)
        return node

    def ids_of(self, tokens: Sequence[int], extra_keys: Hashable = None) -> list[int]:
        """The chained ids of a prompt's full blocks (the prefix index's)."""
        return block_ids(tokens, self.block_size, root_id(extra_keys))

    def longest_hit(self, ids: Sequence[int], max_blocks: int) -> list[Node]:
        """The cached nodes of the longest cached prefix, at most ``max_blocks`` long.

        Linear, not a binary search: a block in the middle of a chain may have been evicted
        while later ones stay cached, and vLLM's hit stops at the first missing one.
        """
        if not self.enable_caching:
            return []
        by_id = self.by_id
        hit: list[Node] = []
        for block_id in ids[:max_blocks]:
            node = by_id.get(block_id)
            if node is None or not node.blocks:
                break
            hit.append(node)
        return hit

    # -- allocation ----------------------------------------------------------------------------

    def touch(self, nodes: Sequence[Node]) -> list[int]:
        """Take a reference on the first cached block of each node (a prefix-cache hit)."""
        out = [node.blocks[0] for node in nodes]
        self.hold(out)
        if self.residency is not None:
            for block in out:
                self.residency.accessed(block)
        return out

    def allocate(self, count: int) -> list[int]:
        """Take ``count`` blocks from the head of the free queue, evicting what they cached."""
        if count > len(self.free):
            raise NoFreeBlocks(f"asked for {count} blocks, {len(self.free)} free")
        out = []
        residency = self.residency
        for _ in range(count):
            block, _ = self.free.popitem(last=False)
            self._uncache(block)
            self.ref_cnt[block] = 1
            if residency is not None:
                residency.allocated(block)
            out.append(block)
        return out

    def _uncache(self, block: int) -> None:
        node = self.node_of[block]
        if node is None:
            return
        self.evictions += 1
        if self.residency is not None:
            self.residency.evicted(block)
        if self.events is not None:
            self.events.removed(node.id)
        node.blocks.remove(block)
        self.node_of[block] = None
        # Drop identities that cache nothing and lead nowhere, so the index stays bounded.
        while node is not None and not node.blocks and not node.children:
            parent = node.parent
            if parent is None:
                if self.roots.get(node.key) is node:
                    del self.roots[node.key]
            else:
                if self.by_id.get(node.id) is node:
                    del self.by_id[node.id]
                parent.children -= 1
            node = parent

    def cache(self, parent: Node, block_tokens: tuple[int, ...], block: int) -> Node:
        """Record that physical ``block`` holds ``block_tokens`` after ``parent``."""
        if not self.enable_caching:
            return parent
        return self.cache_id(parent, child_id(parent.id, parent.depth + 1, block_tokens), block)

    def cache_id(self, parent: Node, block_id: int, block: int) -> Node:
        """Record that physical ``block`` holds the block with chained id ``block_id``."""
        if not self.enable_caching:
            return parent
        node = self.by_id.get(block_id)
        if node is None:
            node = self.by_id[block_id] = Node(parent, block_id, parent.depth + 1, None)
            parent.children += 1
        if self.node_of[block] is None:
            node.blocks.append(block)
            self.node_of[block] = node
        return node

    def cache_blocks(self, parent: Node, blocks: Sequence[tuple[int, ...]],
                     physical: Sequence[int], extra_keys: Hashable = None) -> list[Node]:
        """Cache consecutive full ``blocks`` (token tuples) after ``parent`` in the physical
        blocks ``physical``, as one vLLM ``cache_full_blocks`` call (one stored event)."""
        if not self.enable_caching or not blocks:
            return []
        first = parent.depth + 1
        nodes = []
        node = parent
        for block_tokens, block in zip(blocks, physical, strict=True):
            node = self.cache(node, block_tokens, block)
            nodes.append(node)
        if self.events is not None:
            self.events.stored(_parent_id(parent), [n.id for n in nodes],
                               [t for b in blocks for t in b], extra_keys, first)
        return nodes

    def hold(self, blocks: Sequence[int]) -> None:
        """Take one more reference on blocks already held (a copy in flight pins them)."""
        for block in blocks:
            if self.ref_cnt[block] == 0:
                del self.free[block]
            self.ref_cnt[block] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference on each block, tail first; unreferenced blocks become free.

        Cached blocks join the tail of the queue (evicted last); blocks that cache nothing
        go to the head, to be reused first.
        """
        for block in reversed(blocks):
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self.free[block] = None
                if self.node_of[block] is None:
                    self.free.move_to_end(block, last=False)

    def admit(self, tokens: Sequence[int], extra_keys: Hashable = None
              ) -> Admission | None:
        """Look up, reference and cache a prompt's blocks, as vLLM schedules a request.

        Returns None (nothing changed) when the pool cannot hold the prompt right now.
        """
        bs = self.block_size
        ids = self.ids_of(tokens, extra_keys) if self.enable_caching else []
        max_blocks = max(len(tokens) - 1, 0) // bs
        hit = self.longest_hit(ids, max_blocks)
        needed = -(-len(tokens) // bs) - len(hit)
        evictable_hits = sum(1 for n in hit if self.ref_cnt[n.blocks[0]] == 0)
        if needed > self.num_free - evictable_hits:
            return None
        held = self.touch(hit) + self.allocate(needed)
        path = list(hit)
        parent = hit[-1] if hit else self.root(extra_keys)
        first_parent = parent
        for i in range(len(hit), len(ids)):
            parent = self.cache_id(parent, ids[i], held[i])
            path.append(parent)
        if self.events is not None and len(ids) > len(hit):
            self.events.stored(_parent_id(first_parent), ids[len(hit):],
                               tokens[len(hit) * bs: len(ids) * bs], extra_keys, len(hit))
        return Admission(cached_tokens_for(len(tokens), len(hit), bs), held, path)

    def reset(self) -> None:
        """Forget everything (a server restart)."""
        residency = self.residency
        events = self.events
        self.__init__(self.num_blocks, self.block_size, self.enable_caching)  # type: ignore[misc]
        self.events = events
        if residency is not None:
            residency.reset()
            self.residency = residency
