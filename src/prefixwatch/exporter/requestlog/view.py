"""The request-level view: the audit, run incrementally over a sliding window of recent requests.

The window is the audit's prefix index (``core.prefixindex.PrefixIndex``, an exact radix tree
over token ids) with a count of requests on each node: when a request leaves the window, the
tokens no other request in the window holds are dropped, so memory stays bounded however long
the log runs (at most ``max_requests`` requests and ``max_blocks`` distinct full KV blocks).
Each request is packed once into an ``array('I')`` (4 bytes a token), as its new edges are.

``RequestView`` adds what the exporter exports: the achievable hit ratio of the recent
requests, where they diverge (a histogram), and what varies there (the audit's kinds), with
the token where that value starts for the culprit (``core.whatvaries.value_start``).
"""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence

from prometheus_client.utils import floatToGoString

from prefixwatch.core.cache.prefixindex import Divergence, PrefixIndex
from prefixwatch.core.cache.requestledger import Ledger, Parts
from prefixwatch.core.cache.whatvaries import (
    OWN_CONTENT_SHARE,
    guess_kind,
    one_token_reader,
    value_start,
)
from prefixwatch.core.diagnosis import RequestEvidence
from prefixwatch.core.vocab import exposition


def new_window(block_size: int, max_requests: int = exposition.REQUESTS_WINDOW_REQUESTS,
               max_blocks: int = exposition.REQUESTS_WINDOW_BLOCKS) -> PrefixIndex:
    """The one prefix index, bounded to a sliding window of recent requests."""
    return PrefixIndex(block_size, max_requests, max_blocks)


Decoder = Callable[[Sequence[int]], str]


class RequestView:
    """Requests log -> achievable ratio, divergence histogram and kinds, thread-safe."""

    KIND_CACHE = 1024

    def __init__(self, block_size: int = 16,
                 max_requests: int = exposition.REQUESTS_WINDOW_REQUESTS,
                 max_blocks: int = exposition.REQUESTS_WINDOW_BLOCKS,
                 clock: Callable[[], float] = time.time,
                 pool_blocks: Callable[[Hashable], int | None] | None = None) -> None:
        self.max_requests = max_requests
        self.max_blocks = max_blocks
        self.clock = clock
        self.lock = threading.Lock()
        self._decoder: Decoder | None = None
        self._piece: Callable[[int], str] | None = None
        self.index = new_window(block_size, max_requests, max_blocks)
        self.bounds = tuple(float(b) for b in exposition.DIVERGENCE_BUCKETS) + (math.inf,)
        self.bucket_counts = [0] * len(self.bounds)  # per bucket, not cumulative
        self.divergence_sum = 0.0
        self.lines = dict.fromkeys(exposition.REQUESTS_LOG_RESULTS, 0)
        #: (position, prefix hash) -> the kind that varies there and how many tokens before
        #: the position its value starts (None: not known, the tokenizer failed).
        self._kinds: OrderedDict[tuple[int, int], tuple[str, int | None]] = OrderedDict()
        #: The hit-rate ledger, fed from the same window (core/cache/requestledger.py).
        self.ledger = Ledger(block_size, pool_blocks)

    @property
    def decoder(self) -> Decoder | None:
        """Token ids -> text, for the kinds (None: no tokenizer)."""
        return self._decoder

    @decoder.setter
    def decoder(self, decode: Decoder | None) -> None:
        self._decoder = decode
        self._piece = None if decode is None else one_token_reader(decode)

    @property
    def block_size(self) -> int:
        return self.index.bs

    def set_block_size(self, block_size: int) -> bool:
        """Follow the server's block size; the window starts again when it changes."""
        with self.lock:
            if block_size == self.index.bs or block_size < 1:
                return False
            self.index = new_window(block_size, self.max_requests, self.max_blocks)
            self.ledger.reset(block_size)
            self._kinds.clear()
            return True

    def count(self, result: str, n: int = 1) -> None:
        with self.lock:
            self.lines[result] += n

    def add(self, tokens: Sequence[int], extra_keys: Hashable = None, truncated: bool = False,
            warm: bool = False, replica: Hashable = None, cached: int | None = None,
            output: int | None = None) -> None:
        """One logged request (raises OverflowError on a token id beyond 32 bits).

        ``warm``: history read before following the log; it fills the window's index but is
        not counted, and its time (0) keeps it out of every window's figures. ``replica``
        ``cached`` (the engine's cached tokens) and ``output`` (its max_tokens) feed the
        ledger when the log has them.
        """
        packed = array("I", tokens)  # raises OverflowError: nothing is counted
        with self.lock:
            entry, divergence = self.index.add_timed(packed, extra_keys,
                                                     0.0 if warm else self.clock())
            self.ledger.account(self.index, packed, extra_keys, entry, divergence, replica,
                                cached, warm, output)
            if warm:
                return
            self.lines["truncated" if truncated else "request"] += 1
            if divergence is None:
                return
            slot = next(i for i, b in enumerate(self.bounds) if divergence.position <= b)
            self.bucket_counts[slot] += 1
            self.divergence_sum += divergence.position
            key = (divergence.position, hash(divergence.mine[:divergence.offset]))
            named = self._kinds.get(key)
            decoder, piece = self._decoder, self._piece
        if named is None:  # may call a server: outside the lock
            named = self._classify(divergence, decoder, piece)
        with self.lock:
            self._kinds[key] = named
            self._kinds.move_to_end(key)
            while len(self._kinds) > self.KIND_CACHE:
                self._kinds.popitem(last=False)
            entry.kind, back = named
            entry.culprit_at = None if back is None else divergence.position - back

    @staticmethod
    def _classify(div: Divergence, decoder: Decoder | None,
                  piece: Callable[[int], str] | None) -> tuple[str, int | None]:
        """The kind that varies at ``div`` and how many tokens before it its value starts
        (None: not known, so the request does not vote for the culprit)."""
        if decoder is None or piece is None:
            return "unknown", None
        try:
            before = decoder(div.mine[:div.offset])
            mine = decoder(div.mine[div.offset:])
            theirs = decoder(div.theirs[div.offset:])
        except Exception:  # a decoder failing is not the request's fault
            return "unknown", None
        kind = guess_kind(mine, theirs, before)
        try:
            return kind, value_start(kind, div.mine[:div.offset], piece)
        except Exception:  # a decoder failing is not the request's fault
            return kind, None

    def evidence(self, window: float) -> tuple[RequestEvidence, Counter[str]]:
        """The requests of the last ``window`` seconds (with their ledger), and their
        divergence kinds."""
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
            # The ledger of the same requests (same ``since``, same lock): the diagnosis
            # judges its parts rather than a second figure of its own.
            ev.ledger = self.ledger.window(since)
            ev.ledger_unmeasured = self.ledger.unmeasured()
        return ev, kinds

    def divergences(self, window: float) -> Counter[tuple[str, int]]:
        """The early divergences of the last ``window`` seconds by (kind, token position):
        each request's, before the share of its prompt where its own content starts, at the
        token where the value that varies there starts."""
        since = self.clock() - window
        counts: Counter[tuple[str, int]] = Counter()
        with self.lock:
            for entry in reversed(self.index.window):
                if entry.at < since:
                    break
                if (entry.kind is not None and entry.culprit_at is not None
                        and entry.prompt_tokens
                        and entry.reach < OWN_CONTENT_SHARE * entry.prompt_tokens):
                    counts[(entry.kind, entry.culprit_at)] += 1
        return counts

    def ledger_window(self, window: float) -> tuple[Parts, tuple[str, ...]]:
        """The ledger of the last ``window`` seconds, and the parts it cannot tell apart."""
        with self.lock:
            return self.ledger.window(self.clock() - window), self.ledger.unmeasured()

    def ledger_totals(self) -> tuple[Parts, tuple[str, ...]]:
        """The ledger of every request counted since start (the counters)."""
        with self.lock:
            return Parts(**{k: getattr(self.ledger.totals, k) for k in (
                "prompt", "novel", "layout", "routing", "eviction", "pool_reach",
                "achieved", "requests")}), self.ledger.unmeasured()

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
