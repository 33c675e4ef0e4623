"""Reading a YAML config file: the exporter's and the mixin's, one loading path.

A typo in a config is the most common first error, so every message names the file, the line
and the column of the key (``rules.yml:3:7: ...``), as compilers do, and the key's path; an
unknown key names the closest valid one. Errors are a ``ConfigError`` (one line, exit status
2), never PyYAML's multi-line report.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from prefixwatch.core.errors import ConfigError

#: Config files are small; a bigger one is a wrong path (a log, a data file), not a config.
MAX_BYTES = 4 * 1024 * 1024


def read_text(path: str, what: str = "config file") -> str:
    """The file's text; ConfigError when it cannot be read, is too big or is not UTF-8."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path!r}: {exc.strerror}") from exc
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{what} {path!r} is larger than {MAX_BYTES // (1024 * 1024)} MB")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path!r} is not UTF-8 text (byte {exc.start})") from exc


class ConfigFile:
    """A config mapping and where each of its keys was written (``file:line:column``, by key
    path; list items by their index)."""

    def __init__(self, data: Mapping[str, Any], path: str | None = None,
                 text: str | None = None, what: str = "config file") -> None:
        self.data = dict(data)
        self.path = path or what
        self.marks: dict[tuple[str, ...], Any] = {}
        if text is not None:
            self._walk(yaml.compose(text), ())

    @classmethod
    def load(cls, path: str, what: str = "config file") -> ConfigFile:
        """A YAML file that must hold a mapping (an empty file is an empty mapping)."""
        text = read_text(path, what)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(describe_yaml_error(path, exc)) from exc
        if data is None:
            return cls({}, path, None, what)
        if not isinstance(data, dict):
            raise ConfigError(f"{what} {path!r} must hold a mapping")
        return cls(data, path, text, what)

    def _walk(self, node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                path = (*prefix, str(key.value))
                self.marks[path] = key.start_mark
                self._walk(value, path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                self.marks[(*prefix, str(i))] = item.start_mark
                self._walk(item, (*prefix, str(i)))

    def where(self, *keys: str) -> str:
        """``file:line:column`` of the deepest of ``keys`` that was written (the file alone
        when none was)."""
        for n in range(len(keys), 0, -1):
            mark = self.marks.get(tuple(keys[:n]))
            if mark is not None:
                return f"{self.path}:{mark.line + 1}:{mark.column + 1}"
        return self.path

    def check_keys(self, section: Mapping[str, Any], allowed: Iterable[str], *at: str,
                   what: str = "key") -> None:
        """ConfigError on the first key of ``section`` (at key path ``at``) not in
        ``allowed``, naming its place, its path and the closest valid key."""
        allowed = sorted(allowed)
        unknown = sorted(str(k) for k in set(section) - set(allowed))
        if unknown:
            key = unknown[0]
            raise ConfigError(f"{self.where(*at, key)}: unknown {what} "
                              f"{'.'.join((*at, key))!r}{suggest(key, allowed)}")


def suggest(key: str, allowed: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` with the closest valid key, or nothing."""
    close = difflib.get_close_matches(key, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def describe_yaml_error(path: str, exc: yaml.YAMLError) -> str:
    """``path:line:column: not valid YAML: problem`` (1-based, as editors count)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
    problem = getattr(exc, "problem", None) or "syntax error"
    context = getattr(exc, "context", None)
    detail = f"{problem} ({context})" if context else problem
    return f"{where}: not valid YAML: {detail}"
