"""SGLang's KV event stream, as a simulated SGLang replica publishes it.

What SGLang does (``python/sglang/srt/disaggregation/kv_events.py``,
``mem_cache/radix_cache.py``, ``mem_cache/hiradix_cache.py``): the scheduler takes the radix
cache's queued events after each step and publishes them as one ``KVEventBatch``
``[ts, events, attn_dp_rank]`` on the same ZMQ PUB/ROUTER publisher as vLLM's (topic, 8-byte
sequence, msgpack payload; replay the same). Each event is a positional array with its tag
first: a ``BlockStored`` per page of every new tree node (one hash, its parent the previous
page's, None at the root; ``lora_id`` None; ``medium`` "GPU"), a ``BlockRemoved`` per page of
every evicted node, ``AllBlocksCleared`` when the tree is reset (a new process starts with
one). HiCache publishes its host pool's pages with ``medium`` "CPU_PINNED" when their
write-through completes, and their removal when the host pool evicts them. Hashes are SHA-256
page chains (``core/cache/radixcache.py``): not seeded per process, the same on every replica.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from typing import Any

import msgspec

from prefixwatch.core.kv.codec import (
    SGLangAllBlocksCleared,
    SGLangBlockRemoved,
    SGLangBlockStored,
    SGLangEventBatch,
)
from prefixwatch.simulator.kvpublisher import StepEvents

MEDIUM_GPU = "GPU"
#: SGLang's StorageMedium.CPU: the HiCache host pool.
MEDIUM_HOST = "CPU_PINNED"


class SGLangEventSink(StepEvents):
    """One SGLang replica's events of the current scheduler step (the radix cache's queue)."""

    def __init__(self) -> None:
        super().__init__(SGLangAllBlocksCleared())  # RadixCache.reset() at start
        self.seed = 0  # unseeded; KVEvents.restart sets it, nothing reads it

    # -- the radix cache's hooks ---------------------------------------------------------------

    def stored_pages(self, parent: int | None, hashes: Sequence[int], tokens: Sequence[int],
                     page_size: int) -> None:
        out = []
        for i, h in enumerate(hashes):
            page = list(tokens[i * page_size:(i + 1) * page_size])
            out.append(SGLangBlockStored([h], parent, page, len(page), None, MEDIUM_GPU))
            parent = h
        self._add(*out)

    def removed_pages(self, hashes: Sequence[int]) -> None:
        out = [SGLangBlockRemoved([h], MEDIUM_GPU) for h in hashes]
        self._add(*out)

    # -- the host pool's hooks (offload.HostTier) ----------------------------------------------

    def stored_host(self, parent_id: int | None, block_id: int, tokens: Sequence[int],
                    extra_keys: Hashable = None) -> None:
        event = SGLangBlockStored([block_id], parent_id, list(tokens), len(tokens), None,
                                  MEDIUM_HOST)
        self._add(event)

    def removed(self, block_id: int, medium: str = MEDIUM_HOST) -> None:
        event = SGLangBlockRemoved([block_id], MEDIUM_HOST if medium != MEDIUM_GPU else medium)
        self._add(event)

    def cleared(self) -> None:
        self._add(SGLangAllBlocksCleared())


_encoder = msgspec.msgpack.Encoder()


def encode_sglang_batch(events: list[Any], ts: float | None = None,
                        data_parallel_rank: int = 0) -> bytes:
    """The payload SGLang's publisher sends for one step's events."""
    batch = SGLangEventBatch(time.time() if ts is None else ts, events, data_parallel_rank)
    return _encoder.encode(batch)
