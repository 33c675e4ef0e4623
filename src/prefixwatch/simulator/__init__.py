"""A vLLM-faithful prefix-cache simulator: the built-in target for the demo and the tests."""
