"""SGLang's caching rule: a radix tree of token runs, page-granular, LRU over unreferenced leaves.

What SGLang does (``python/sglang/srt/mem_cache/radix_cache.py`` and
``managers/schedule_batch.py``), and what this module follows:

* **Matching** (``match_prefix``, ``_match_prefix_helper``, ``_key_match_paged``): the longest
  run of the key found in the tree, compared token by token (``page_size`` 1, SGLang's default)
  or a whole page at a time, the key first cut to whole pages. A match that ends inside a node
  splits it (``_split_node``), and every node on the path has its access time refreshed.
* **At least one prompt token computed** (``Req.adjust_max_prefix_ids`` /
  ``_compute_max_prefix_len``): the key a request looks up is its first ``len - 1`` tokens, so
  a prompt the tree holds whole still computes its last token (its last page, with pages).
* **Insertion** (``insert``, ``_insert_helper``, ``cache_unfinished_req``,
  ``cache_finished_req``): what a request computed goes into the tree page-aligned, after its
  prefill (the prompt) and when it finishes (prompt and answer, all but the last sampled
  token). A run the tree already holds is not stored twice: the request's copy is freed.
  Each new node publishes one ``BlockStored`` per page (``_record_store_event``).
* **Eviction** (``evict``, ``_update_leaf_status``): the leaves no running request references
  (``lock_ref`` 0), least recently accessed first, each removed whole (every page of it: one
  ``BlockRemoved`` per page, ``_record_remove_event``); a parent left childless and unlocked
  becomes a candidate in turn.
* **Namespaces**: requests with other extra keys (a LoRA adapter, a ``cache_salt``) never share
  nodes (``RadixKey.extra_key``); here each namespace has a root of its own, and its chains'
  hashes start from a digest of its keys (SGLang 0.5's start from nothing whatever the
  namespace; newer releases seed them too), so two namespaces never publish one hash.
* **Hashes** (``compute_node_hash_values``, ``get_hash_str``, ``hash_str_to_int64``): a page's
  hash is SHA-256 over the previous page's digest and its token ids (4 bytes little-endian
  each); events carry its first 8 bytes as a signed 64-bit integer, the parent of a node's first
  page being None at the root. Unseeded: every replica publishes the same hash for the same
  content.

Sizes are in tokens, as SGLang's ``token_to_kv_pool_allocator`` counts them: ``free`` slots,
``evictable`` (cached, unreferenced) and ``protected`` (cached, referenced) tree tokens.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from collections.abc import Hashable, Sequence
from typing import Protocol

__all__ = ["PageEvents", "RadixCache", "RadixNode", "max_prefix_tokens", "namespace_seed",
           "page_hash", "signed64"]


def max_prefix_tokens(num_tokens: int, page_size: int = 1) -> int:
    """The most a prompt of ``num_tokens`` can be served from cache: its first
    ``num_tokens - 1`` tokens cut to whole pages (SGLang's ``adjust_max_prefix_ids``)."""
    return max(num_tokens - 1, 0) // page_size * page_size


def page_hash(tokens: Sequence[int], prior: bytes | None) -> bytes:
    """The SHA-256 digest of one page after the page whose digest is ``prior`` (SGLang's
    ``get_hash_str``: the prior digest, then each token id as 4 bytes little-endian)."""
    h = hashlib.sha256(prior or b"")
    h.update(b"".join(t.to_bytes(4, "little") for t in tokens))
    return h.digest()


def namespace_seed(extra_keys: Hashable) -> bytes | None:
    """The digest a namespace's chains start from: None for plain requests (SGLang's root),
    else a digest of the extra keys, so two namespaces never publish the same hash."""
    if extra_keys is None:
        return None
    return hashlib.sha256(repr(extra_keys).encode("utf-8")).digest()


def signed64(digest: bytes) -> int:
    """The block hash an event carries for a page digest (SGLang's ``hash_str_to_int64``)."""
    return int.from_bytes(digest[:8], "big", signed=True)


class PageEvents(Protocol):
    """Who hears of the tree's stores and evictions (SGLang's KV event queue)."""

    def stored_pages(self, parent: int | None, hashes: Sequence[int], tokens: Sequence[int],
                     page_size: int) -> None:
        """A new node's pages: ``hashes[i]`` holds ``tokens[i*page_size:(i+1)*page_size]``,
        the first page after ``parent`` (None at the root)."""

    def removed_pages(self, hashes: Sequence[int]) -> None:
        """An evicted node's pages."""


class RadixNode:
    """A run of tokens (whole pages) after its parent's, and who references it."""

    __slots__ = ("access", "children", "digests", "id", "key", "lock_ref", "parent")

    def __init__(self, parent: RadixNode | None, key: tuple[int, ...], node_id: int) -> None:
        self.parent = parent
        self.key = key
        self.children: dict[int | tuple[int, ...], RadixNode] = {}
        self.lock_ref = 0
        self.access = 0
        self.id = node_id
        #: One SHA-256 digest per page, computed when a store is published (None: not yet).
        self.digests: list[bytes] | None = None

    def __lt__(self, other: RadixNode) -> bool:
        return (self.access, self.id) < (other.access, other.id)


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the common prefix of two token runs (slices compared in C, a stretch at
    a time, then token by token inside the first stretch that differs)."""
    n = min(len(a), len(b))
    i = 0
    step = 256
    while i < n:
        j = min(i + step, n)
        if a[i:j] == b[i:j]:
            i = j
            continue
        while a[i] == b[i]:
            i += 1
        return i
    return n


class RadixCache:
    """One SGLang replica's KV pool of ``capacity`` tokens and its radix tree."""

    def __init__(self, capacity: int, page_size: int = 1, enable_caching: bool = True) -> None:
        if page_size < 1:
            raise ValueError("page_size must be at least 1")
        if capacity < page_size:
            raise ValueError("the pool needs at least one page")
        self.page_size = page_size
        self.capacity = capacity // page_size * page_size
        self.enable_caching = enable_caching
        self.free = self.capacity
        self.evictable = 0
        self.protected = 0
        self.roots: dict[Hashable, RadixNode] = {}
        self._leaves: set[RadixNode] = set()
        self._ids = itertools.count(1)
        self._tick = 0
        #: Tokens evicted from the tree (SGLang's evicted tokens).
        self.evicted_tokens = 0
        #: Store and eviction hooks (SGLang's KV event stream); None when off.
        self.events: PageEvents | None = None

    # -- sizes ---------------------------------------------------------------------------------

    @property
    def available(self) -> int:
        """Tokens a new request can have: free slots and what eviction can free."""
        return self.free + self.evictable

    def usage(self) -> float:
        """SGLang's token usage: (capacity - free - evictable) / capacity."""
        return (self.capacity - self.free - self.evictable) / self.capacity

    def root(self, extra_keys: Hashable) -> RadixNode:
        node = self.roots.get(extra_keys)
        if node is None:
            node = self.roots[extra_keys] = RadixNode(None, (), 0)
            node.lock_ref = 1  # SGLang's root is never evicted
            seed = namespace_seed(extra_keys)
            node.digests = [seed] if seed is not None else []
        return node

    # -- the tree ------------------------------------------------------------------------------

    def _child_key(self, key: Sequence[int]) -> int | tuple[int, ...]:
        return key[0] if self.page_size == 1 else tuple(key[:self.page_size])

    def _match_len(self, a: Sequence[int], b: Sequence[int]) -> int:
        n = _common(a, b)
        return n if self.page_size == 1 else n // self.page_size * self.page_size

    def match(self, tokens: Sequence[int], extra_keys: Hashable = None
              ) -> tuple[int, RadixNode]:
        """The longest cached run of ``tokens`` (cut to whole pages) and the node it ends at,
        splitting a node a match ends inside; refreshes every node on the path."""
        matched, node, _rest = self._walk(tokens, extra_keys)
        return matched, node

    def _walk(self, tokens: Sequence[int], extra_keys: Hashable
              ) -> tuple[int, RadixNode, tuple[int, ...]]:
        """Follow ``tokens`` (whole pages) down the tree: the tokens found, the node they end
        at (a node the run ends inside is split there) and the tokens left over. Every node on
        the path has its access time refreshed (SGLang's ``_match_prefix_helper``)."""
        node = self.root(extra_keys)
        key = tuple(tokens[:len(tokens) // self.page_size * self.page_size])
        if not self.enable_caching:
            return 0, node, key
        self._tick += 1
        node.access = self._tick
        found = 0
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            child.access = self._tick
            n = self._match_len(child.key, key)
            found += n
            key = key[n:]
            if n < len(child.key):
                node = self._split(child, n)
                break  # the rest of the run differs from what follows the split
            node = child
        return found, node, key

    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Cut ``child`` after ``at`` tokens: a new node holds the first part."""
        parent = child.parent
        assert parent is not None
        new = RadixNode(parent, child.key[:at], next(self._ids))
        new.lock_ref = child.lock_ref
        new.access = child.access
        parent.children[self._child_key(new.key)] = new
        child.key = child.key[at:]
        child.parent = new
        new.children[self._child_key(child.key)] = child
        if child.digests is not None:
            pages = at // self.page_size
            new.digests, child.digests = child.digests[:pages], child.digests[pages:]
        return new

    def insert(self, tokens: Sequence[int], extra_keys: Hashable = None
               ) -> tuple[int, RadixNode]:
        """Put ``tokens`` (cut to whole pages) into the tree: returns how many were there
        already and the node the run ends at. The new tokens are the tree's (evictable until
        locked); the caller frees its copy of the ones already there."""
        present, node, key = self._walk(tokens, extra_keys)
        if key and self.enable_caching:
            leaf = RadixNode(node, key, next(self._ids))
            leaf.access = self._tick
            node.children[self._child_key(key)] = leaf
            self.evictable += len(key)
            self._leaf_status(node)
            self._leaf_status(leaf)
            if self.events is not None:
                self._publish_store(leaf)
            node = leaf
        return present, node

    def _digests(self, node: RadixNode) -> list[bytes]:
        if node.digests is None:
            parent = node.parent
            assert parent is not None
            above = self._digests(parent)
            prior = above[-1] if above else None
            out = []
            ps = self.page_size
            for i in range(0, len(node.key), ps):
                prior = page_hash(node.key[i:i + ps], prior)
                out.append(prior)
            node.digests = out
        return node.digests

    def _publish_store(self, node: RadixNode) -> None:
        assert self.events is not None
        parent = node.parent
        parent_hash = (signed64(self._digests(parent)[-1])
                       if parent is not None and parent.key else None)
        hashes = [signed64(d) for d in self._digests(node)]
        self.events.stored_pages(parent_hash, hashes, node.key, self.page_size)

    # -- references ----------------------------------------------------------------------------

    def lock(self, node: RadixNode) -> None:
        """A running request references ``node`` and its ancestors (``inc_lock_ref``)."""
        while node.parent is not None:
            if node.lock_ref == 0:
                self.evictable -= len(node.key)
                self.protected += len(node.key)
            node.lock_ref += 1
            self._leaf_status(node)
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        """The reference ``lock`` took is dropped (``dec_lock_ref``)."""
        while node.parent is not None:
            if node.lock_ref == 1:
                self.evictable += len(node.key)
                self.protected -= len(node.key)
            node.lock_ref -= 1
            self._leaf_status(node)
            node = node.parent

    def _leaf_status(self, node: RadixNode) -> None:
        if node.parent is not None and node.lock_ref == 0 and not node.children:
            self._leaves.add(node)
        else:
            self._leaves.discard(node)

    # -- the pool ------------------------------------------------------------------------------

    def allocate(self, tokens: int) -> bool:
        """Take ``tokens`` slots (whole pages), evicting leaves when the free slots are short;
        False (nothing taken) when even eviction cannot make the room."""
        tokens = -(-tokens // self.page_size) * self.page_size
        if tokens > self.free + self.evictable:
            return False
        if tokens > self.free:
            self.evict(tokens - self.free)
        self.free -= tokens
        return True

    def release(self, tokens: int) -> None:
        """Give back ``tokens`` slots a request held outside the tree."""
        self.free += tokens

    def evict(self, tokens: int) -> int:
        """Free at least ``tokens`` slots by removing unreferenced leaves, least recently
        accessed first (SGLang's LRU eviction strategy); returns the tokens evicted."""
        heap = list(self._leaves)
        heapq.heapify(heap)
        evicted = 0
        while evicted < tokens and heap:
            leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            if self.events is not None:
                self.events.removed_pages([signed64(d) for d in self._digests(leaf)])
            del parent.children[self._child_key(leaf.key)]
            self._leaves.discard(leaf)
            self.evictable -= len(leaf.key)
            self.free += len(leaf.key)
            evicted += len(leaf.key)
            self._leaf_status(parent)
            if parent in self._leaves:
                heapq.heappush(heap, parent)
            elif parent.parent is None and not parent.children:
                self.roots.pop(next((k for k, v in self.roots.items() if v is parent)), None)
        self.evicted_tokens += evicted
        return evicted

    def reset(self) -> None:
        """Forget everything (a server restart)."""
        events = self.events
        self.__init__(self.capacity, self.page_size, self.enable_caching)  # type: ignore[misc]
        self.events = events
