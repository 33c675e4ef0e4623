"""The request-level view: the audit, run incrementally over a sliding window of recent requests.

``SlidingPrefixIndex`` is the audit's prefix trie (vLLM's chained full blocks, one dict look-up
per block) with reference counts: when a request leaves the window, the blocks no other
request in the window holds are dropped, so memory stays bounded however long the log runs
(at most ``max_requests`` requests and ``max_blocks`` distinct blocks). Blocks are stored as
packed bytes (4 bytes a token), about a sixth of the memory of a tuple of ints.

``RequestView`` adds what the exporter exports: the achievable hit ratio of the recent
requests, where they diverge (a histogram), and what varies there (the audit's kinds).
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from os.path import commonprefix

from prometheus_client.utils import floatToGoString

from prefixwatch.core import names
from prefixwatch.core.blockcache import cached_tokens_for
from prefixwatch.core.diagnosis import RequestEvidence
from prefixwatch.core.prefixindex import Divergence, closest_sibling, divergence_at
from prefixwatch.core.whatvaries import guess_kind

_TOKEN_BYTES = 4


class _Node:
    __slots__ = ("children", "count", "key", "parent")

    def __init__(self, parent: _Node | None, key: bytes) -> None:
        self.children: dict[bytes, _Node] = {}
        self.count = 0
        self.key = key
        self.parent = parent


def _pack(tokens: Sequence[int]) -> bytes:
    return array("I", tokens).tobytes()


def _unpack(data: bytes) -> tuple[int, ...]:
    out = array("I")
    out.frombytes(data)
    return tuple(out)


@dataclass
class _Entry:
    at: float
    extra_keys: Hashable
    path: list[_Node]
    prompt_tokens: int
    cacheable_tokens: int
    long: bool
    kind: str | None


class SlidingPrefixIndex:
    """The audit's PrefixIndex over the most recent requests only."""

    def __init__(self, block_size: int, max_requests: int = names.REQUESTS_WINDOW_REQUESTS,
                 max_blocks: int = names.REQUESTS_WINDOW_BLOCKS) -> None:
        if block_size < 1 or max_requests < 1 or max_blocks < 1:
            raise ValueError("block size and window bounds must be at least 1")
        self.bs = block_size
        self.max_requests = max_requests
        self.max_blocks = max_blocks
        self.roots: dict[Hashable, _Node] = {}
        self.window: deque[_Entry] = deque()
        self.blocks = 0  # distinct nodes held (full blocks and partial tails)

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None, at: float = 0.0
            ) -> tuple[_Entry, Divergence | None]:
        """Match a request against the window, then add it; returns its entry and divergence.

        Raises OverflowError for a token id that does not fit in 32 bits.
        """
        bs = self.bs
        n = len(tokens)
        full = n - n % bs
        packed = _pack(tokens)
        step = bs * _TOKEN_BYTES
        root = self.roots.get(extra_keys)
        seen_before = root is not None and bool(root.children)
        if root is None:
            root = self.roots[extra_keys] = _Node(None, b"")
        node = root
        matched = 0
        path: list[_Node] = []
        for start in range(0, full * _TOKEN_BYTES, step):
            child = node.children.get(packed[start:start + step])
            if child is None:
                break
            node = child
            path.append(child)
            matched += 1
        divergence = self._divergence(tokens, packed, node, matched) if seen_before else None
        for start in range(matched * step, full * _TOKEN_BYTES, step):
            key = packed[start:start + step]
            child = _Node(node, key)
            node.children[key] = child
            self.blocks += 1
            node = child
            path.append(child)
        if full < n:
            key = packed[full * _TOKEN_BYTES:]
            tail = node.children.get(key)
            if tail is None:
                tail = node.children[key] = _Node(node, key)
                self.blocks += 1
            path.append(tail)
        for member in path:
            member.count += 1
        entry = _Entry(at, extra_keys, path, n, cached_tokens_for(n, matched, bs), n > bs, None)
        self.window.append(entry)
        while len(self.window) > self.max_requests or (
                self.blocks > self.max_blocks and len(self.window) > 1):
            self._drop(self.window.popleft())
        return entry, divergence

    def _drop(self, entry: _Entry) -> None:
        for member in entry.path:
            member.count -= 1
            if member.count == 0 and member.parent is not None:
                if member.parent.children.get(member.key) is member:
                    del member.parent.children[member.key]
                self.blocks -= 1
        root = self.roots.get(entry.extra_keys)
        if root is not None and not root.children:
            del self.roots[entry.extra_keys]

    def _divergence(self, tokens: Sequence[int], packed: bytes, node: _Node, matched: int
                    ) -> Divergence | None:
        bs = self.bs
        start = matched * bs
        if start >= len(tokens):
            return None  # every block matched and nothing is left: no divergence
        rest = packed[start * _TOKEN_BYTES:(start + bs) * _TOKEN_BYTES]
        best, best_key = closest_sibling(
            reversed(node.children), lambda key: len(commonprefix([rest, key])) // _TOKEN_BYTES)
        if best_key is None:
            return None  # earlier requests ended here: this one extends them
        return divergence_at(tokens, start, len(rest) // _TOKEN_BYTES, bs, best,
                             _unpack(best_key))


Decoder = Callable[[Sequence[int]], str]


class RequestView:
    """Requests log -> achievable ratio, divergence histogram and kinds, thread-safe."""

    KIND_CACHE = 1024

    def __init__(self, block_size: int = 16, max_requests: int = names.REQUESTS_WINDOW_REQUESTS,
                 max_blocks: int = names.REQUESTS_WINDOW_BLOCKS,
                 clock: Callable[[], float] = time.time) -> None:
        self.max_requests = max_requests
        self.max_blocks = max_blocks
        self.clock = clock
        self.lock = threading.Lock()
        self.decoder: Decoder | None = None
        self.index = SlidingPrefixIndex(block_size, max_requests, max_blocks)
        self.bounds = tuple(float(b) for b in names.DIVERGENCE_BUCKETS) + (math.inf,)
        self.bucket_counts = [0] * len(self.bounds)  # per bucket, not cumulative
        self.divergence_sum = 0.0
        self.lines = dict.fromkeys(names.REQUESTS_LOG_RESULTS, 0)
        self._kinds: OrderedDict[tuple[int, int], str] = OrderedDict()

    @property
    def block_size(self) -> int:
        return self.index.bs

    def set_block_size(self, block_size: int) -> bool:
        """Follow the server's block size; the window starts again when it changes."""
        with self.lock:
            if block_size == self.index.bs or block_size < 1:
                return False
            self.index = SlidingPrefixIndex(block_size, self.max_requests, self.max_blocks)
            self._kinds.clear()
            return True

    def count(self, result: str, n: int = 1) -> None:
        with self.lock:
            self.lines[result] += n

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None, truncated: bool = False,
            warm: bool = False) -> None:
        """One logged request (raises OverflowError on a token id beyond 32 bits).

        ``warm``: history read before following the log; it fills the window's index but is
        not counted, and its time (0) keeps it out of every window's figures.
        """
        with self.lock:
            entry, divergence = self.index.add(tokens, extra_keys, 0.0 if warm else self.clock())
            if warm:
                return
            self.lines["truncated" if truncated else "request"] += 1
            if divergence is None:
                return
            slot = next(i for i, b in enumerate(self.bounds) if divergence.position <= b)
            self.bucket_counts[slot] += 1
            self.divergence_sum += divergence.position
            key = (divergence.position, hash(divergence.mine[:divergence.offset]))
            kind = self._kinds.get(key)
            decoder = self.decoder
        if kind is None:
            kind = self._classify(divergence, decoder)  # may call a server: outside the lock
        with self.lock:
            self._kinds[key] = kind
            self._kinds.move_to_end(key)
            while len(self._kinds) > self.KIND_CACHE:
                self._kinds.popitem(last=False)
            entry.kind = kind

    @staticmethod
    def _classify(div: Divergence, decoder: Decoder | None) -> str:
        if decoder is None:
            return "unknown"
        try:
            before = decoder(div.mine[:div.offset])
            mine = decoder(div.mine[div.offset:])
            theirs = decoder(div.theirs[div.offset:])
        except Exception:  # a decoder failing is not the request's fault
            return "unknown"
        return guess_kind(mine, theirs, before)

    def evidence(self, window: float) -> tuple[RequestEvidence, Counter[str]]:
        """The requests of the last ``window`` seconds, and their divergence kinds."""
        since = self.clock() - window
        ev = RequestEvidence()
        kinds: Counter[str] = Counter()
        with self.lock:
            for entry in reversed(self.index.window):
                if entry.at < since:
                    break
                ev.requests += 1
                ev.prompt_tokens += entry.prompt_tokens
                ev.cacheable_tokens += entry.cacheable_tokens
                if entry.long:
                    ev.long_requests += 1
                    ev.long_prompt_tokens += entry.prompt_tokens
                    ev.long_cacheable_tokens += entry.cacheable_tokens
                if entry.kind is not None:
                    kinds[entry.kind] += 1
        return ev, kinds

    def histogram(self) -> tuple[list[tuple[str, float]], float]:
        """Cumulative buckets (le, count) and sum of the divergence positions."""
        with self.lock:
            out, running = [], 0
            for bound, count in zip(self.bounds, self.bucket_counts, strict=True):
                running += count
                out.append((floatToGoString(bound), float(running)))
            return out, self.divergence_sum

    def window_size(self) -> tuple[int, int]:
        with self.lock:
            return len(self.index.window), self.index.blocks
