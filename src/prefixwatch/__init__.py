"""prefixwatch: observability and alerting for the prefix cache of LLM servers."""

from prefixwatch.core.version import __version__

__all__ = ["__version__"]
