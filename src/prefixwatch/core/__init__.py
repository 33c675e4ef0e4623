"""Pure foundations, in four subject packages: ``vocab`` (the words every product shares: the
series exposed, the family table, tiers, causes, windows), ``cache`` (vLLM's caching rule and the
prefix index), ``logs`` (request logs and token ids) and ``kv`` (the KV event stream: codec,
mirror, ledger), with the diagnosis over them.

Imports nothing else of prefixwatch; every product imports it.
"""
