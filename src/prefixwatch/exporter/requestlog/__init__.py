"""The request-level view: a requests log followed and indexed over a sliding window."""
