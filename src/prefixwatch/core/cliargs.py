"""The command line's one grammar for values: every sub-command reads a duration, a count, a
port or a factor the same way, and a bad one is the same single line (argparse turns an
``ArgumentTypeError`` into ``prefixwatch X: error: argument --flag: ...`` and exit status 2).

A duration is ``30s``, ``5m``, ``1h`` (``ms`` and ``d`` too) or a bare number of seconds,
wherever a duration is asked; it is finite and greater than zero.
"""

from __future__ import annotations

import argparse
import math
import re

from prefixwatch.core.vocab.windows import DURATION_UNITS

_DURATION = re.compile(r"^(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)(ms|s|m|h|d)?$")
_UNIT = {**DURATION_UNITS, None: 1.0}  # a bare number is seconds
#: No duration the tools take is longer than a year; past it a number is a typo.
MAX_SECONDS = 366 * 86400.0


def seconds(text: str) -> float:
    """``'30s'``, ``'5m'``, ``'1h'`` or ``'30'`` -> seconds; ValueError (one line) otherwise."""
    match = _DURATION.match(str(text).strip())
    if not match:
        raise ValueError(f"not a duration: {str(text)!r} (use e.g. 30s, 5m, 1h, or seconds)")
    value = float(match.group(1)) * _UNIT[match.group(2)]
    if not 0 < value <= MAX_SECONDS:
        raise ValueError(f"{str(text)!r} must be a duration greater than 0 and at most a year")
    return value


def duration(text: str) -> float:
    """argparse type: a duration in seconds (see ``seconds``)."""
    try:
        return seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def duration_text(text: str) -> str:
    """argparse type: a duration checked like ``duration`` but kept as written, in the
    ``30s`` form the configuration takes (a bare number gets its ``s``)."""
    value = duration(text)
    stripped = str(text).strip()
    return stripped if _DURATION.match(stripped).group(2) else f"{value:g}s"  # type: ignore[union-attr]


def _number(text: str, kind: type, what: str, ok, wanted: str):  # noqa: ANN001, ANN202
    """``text`` as ``kind`` (int or float) when ``ok(value)``; else one line for argparse."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{text!r} {wanted}")
    return value


def positive_factor(text: str) -> float:
    """argparse type: a finite number greater than 0 (a scale, a rate)."""
    return _number(text, float, "a number", lambda v: math.isfinite(v) and v > 0,
                   "must be a finite number greater than 0")


def non_negative(text: str) -> float:
    """argparse type: a finite number of 0 or more."""
    return _number(text, float, "a number", lambda v: math.isfinite(v) and v >= 0,
                   "must be 0 or more")


def count(text: str) -> int:
    """argparse type: a whole number of 1 or more."""
    return _number(text, int, "a whole number", lambda v: v >= 1, "must be 1 or more")


def port(text: str) -> int:
    """argparse type: a TCP port, 0 (any free port) to 65535."""
    return _number(text, int, "a port number", lambda v: 0 <= v <= 65535,
                   "is not a port (0-65535)")
