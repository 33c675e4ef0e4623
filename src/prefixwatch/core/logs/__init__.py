"""Request logs, read line by line under a size limit: their formats (OpenAI chat, completion,
pre-tokenized, vLLM's own log), one request or a refused line, token ids packed in C, and the
tokenizers that turn text requests into the ids the server sees.
"""
