"""Routers as targets: their pages read, their workers matched to engine targets."""
