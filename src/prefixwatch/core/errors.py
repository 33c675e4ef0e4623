"""Errors every product reports the same way: one line on stderr and exit status 2."""


class PrefixwatchError(Exception):
    """Bad input or setup the user can fix; the CLI prints it on one line, exit status 2."""


class ConfigError(PrefixwatchError):
    """A bad flag or config file."""
