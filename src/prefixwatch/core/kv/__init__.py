"""The KV event stream and what it tells: the codec engines and the simulator share, each
engine's mirrored blocks (content identity, resident copies), why each computed block was
computed, and the event ledger beside the engine's counters.
"""
