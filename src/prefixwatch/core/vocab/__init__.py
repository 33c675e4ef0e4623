"""The words every product shares, written once: the series prefixwatch exposes, the alert and
recorded-series names, the family table of each engine's samples, engine generations, cache
tiers, the causes of a low hit rate, shared settings, and durations and windowed ratios.
"""
