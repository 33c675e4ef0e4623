"""prefixwatch: observability and alerting for the prefix cache of LLM servers."""

__version__ = "0.1.0"
