"""SGLang's caching rule (core/cache/radixcache.py): token and page matching, the len-1 cap,
one copy per run, LRU eviction of unreferenced leaves, and the hashes SGLang publishes."""

from __future__ import annotations

import hashlib
import struct

import pytest

from prefixwatch.core.cache.radixcache import RadixCache, max_prefix_tokens, page_hash, signed64


class Events:
    def __init__(self) -> None:
        self.stored: list[tuple[int | None, list[int], list[int]]] = []
        self.removed: list[int] = []

    def stored_pages(self, parent, hashes, tokens, page_size) -> None:
        self.stored.append((parent, list(hashes), list(tokens)))

    def removed_pages(self, hashes) -> None:
        self.removed += hashes


def test_the_cap_leaves_one_token_or_one_page_to_compute() -> None:
    assert max_prefix_tokens(2999) == 2998
    assert max_prefix_tokens(2999, 16) == 2992
    assert max_prefix_tokens(32, 16) == 16  # a whole-page prompt recomputes its last page
    assert max_prefix_tokens(1) == 0 and max_prefix_tokens(0) == 0


def test_token_matching_splits_a_node_where_two_prompts_part() -> None:
    cache = RadixCache(1000)
    cache.insert([1, 2, 3, 4, 5])
    matched, node = cache.match([1, 2, 3, 9, 9])
    assert matched == 3 and node.key == (1, 2, 3)
    assert cache.match([1, 2, 3, 4, 5, 6])[0] == 5
    assert cache.match([7])[0] == 0


def test_page_matching_counts_whole_pages_only() -> None:
    cache = RadixCache(1000, page_size=4)
    present, _ = cache.insert(list(range(10)))  # 8 tokens go in: two pages
    assert present == 0 and cache.evictable == 8
    assert cache.match(list(range(7)) + [99])[0] == 4  # the second page differs at token 7
    assert cache.match(list(range(12)))[0] == 8


def test_namespaces_never_share() -> None:
    cache = RadixCache(1000)
    cache.insert([1, 2, 3])
    assert cache.match([1, 2, 3], ("adapter", None))[0] == 0


def test_a_run_the_tree_holds_is_stored_once() -> None:
    events = Events()
    cache = RadixCache(1000)
    cache.events = events
    assert cache.insert([1, 2, 3])[0] == 0
    assert cache.insert([1, 2, 3])[0] == 3 and len(events.stored) == 1
    assert cache.insert([1, 2, 3, 4])[0] == 3
    assert [len(s[1]) for s in events.stored] == [3, 1]
    assert cache.evictable == 4


def test_eviction_takes_unreferenced_leaves_least_recently_used_first() -> None:
    events = Events()
    cache = RadixCache(12)
    cache.events = events
    assert cache.allocate(12)  # three requests computed 4 tokens each, now the tree's
    _, a = cache.insert([1, 2, 3, 4])
    cache.insert([5, 6, 7, 8])
    cache.insert([9, 10, 11, 12])
    cache.match([5, 6, 7])  # refreshes the second run
    cache.lock(a)  # a running request references the first
    assert cache.available == 8
    assert cache.allocate(4)  # evicts the least recently used unreferenced leaf: the third
    assert cache.match([9, 10, 11])[0] == 0 and cache.match([5, 6, 7])[0] == 3
    assert len(events.removed) == 4  # one BlockRemoved per page (per token at page size 1)
    assert not cache.allocate(9)  # the referenced run cannot go
    cache.unlock(a)
    assert cache.allocate(8) and cache.match([1, 2, 3])[0] == 0


def test_the_published_hashes_are_sglangs_page_chain() -> None:
    events = Events()
    cache = RadixCache(100, page_size=2)
    cache.events = events
    cache.insert([1, 2, 3, 4])
    first = hashlib.sha256(struct.pack("<2I", 1, 2)).digest()
    second = hashlib.sha256(first + struct.pack("<2I", 3, 4)).digest()
    want = [struct.unpack(">q", d[:8])[0] for d in (first, second)]
    assert events.stored == [(None, want, [1, 2, 3, 4])]
    assert page_hash([1, 2], None) == first and signed64(first) == want[0]
    cache.insert([1, 2, 3, 4, 5, 6])  # a child's first page names its parent's last
    assert events.stored[1][0] == want[1]


def test_the_pool_keeps_its_books() -> None:
    cache = RadixCache(100)
    assert cache.allocate(30)
    present, node = cache.insert(list(range(30)))
    cache.release(present)  # nothing to free: none was there
    cache.lock(node)
    assert (cache.free, cache.evictable, cache.protected) == (70, 0, 30)
    assert cache.usage() == pytest.approx(0.3)
    cache.unlock(node)
    assert (cache.free, cache.evictable, cache.protected) == (70, 30, 0)
    assert cache.usage() == 0.0  # SGLang counts evictable tokens as available
