"""The package version, in one place every product can read without importing another."""

__version__ = "0.1.0"
