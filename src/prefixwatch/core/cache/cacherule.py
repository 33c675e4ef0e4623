"""vLLM's prefix-caching rule in tokens: what a run of hit blocks serves a prompt.

A module of its own so that the prefix index, the ledger and the block pool share the one
formula, and the audit of a log without a pool size never loads the pool
(``core/cache/blockcache.py``, which re-exports it).
"""

from __future__ import annotations


def cached_tokens_for(num_tokens: int, hit_blocks: int, block_size: int) -> int:
    """Tokens served from cache: whole hit blocks, never past ``num_tokens - 1``."""
    max_blocks = max(num_tokens - 1, 0) // block_size
    return min(hit_blocks, max_blocks) * block_size
