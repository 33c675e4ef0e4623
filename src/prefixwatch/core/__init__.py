"""Pure foundations: metric names and roles, windows, causes, vLLM's block rule, the prefix index.

Imports nothing else of prefixwatch; every product imports it.
"""
