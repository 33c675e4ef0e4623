"""Reading a YAML config file: every loader reports a bad file the same way.

A typo in a config is the most common first error, so the message names the file, the line
and the column (``rules.yml:3:7: not valid YAML: ...``), as compilers do, and is a
``ConfigError`` (one line, exit status 2) rather than PyYAML's multi-line report.
"""

from __future__ import annotations

from typing import Any

import yaml

from prefixwatch.core.errors import ConfigError

#: Config files are small; a bigger one is a wrong path (a log, a data file), not a config.
MAX_BYTES = 4 * 1024 * 1024


def load_yaml(path: str, what: str = "config file") -> Any:
    """The parsed document (None when the file is empty); ConfigError when it cannot be read
    or is not valid YAML, naming ``path:line:column``."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path!r}: {exc.strerror}") from exc
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{what} {path!r} is larger than {MAX_BYTES // (1024 * 1024)} MB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path!r} is not UTF-8 text (byte {exc.start})") from exc
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(describe_yaml_error(path, exc)) from exc


def load_mapping(path: str, what: str = "config file") -> dict[str, Any]:
    """A YAML file that must hold a mapping (an empty file is an empty mapping)."""
    data = load_yaml(path, what)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path!r} must hold a mapping")
    return data


def describe_yaml_error(path: str, exc: yaml.YAMLError) -> str:
    """``path:line:column: not valid YAML: problem`` (1-based, as editors count)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
    problem = getattr(exc, "problem", None) or "syntax error"
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if context else problem
    return f"{where}: not valid YAML: {detail}"
