"""vLLM's caching rule and what a log of requests could have hit: the cached tokens of a run of
blocks, the block pool with its eviction order, the exact prefix index, the layout part's
definition, the ledger of every missed prompt token, and what varies where prompts diverge.
"""
