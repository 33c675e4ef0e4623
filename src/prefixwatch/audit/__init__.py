"""Prompt audit: find the token that breaks the prefix cache, and predict the hit rate of a fix."""
