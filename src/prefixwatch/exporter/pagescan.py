"""Cut an engine's /metrics page down to the sample lines prefixwatch reads, under limits.

A string scan keeps only the lines of wanted samples; their label blocks go through
client_python's parser, memoised per block; the limits (series, models, buckets, label length)
drop what a hostile or huge page would make the exporter hold, and count it.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.vocab import exposition, schemas
from prefixwatch.core.vocab.schemas import SourceSchema

SeriesKey = tuple[str, str]  # (model_name, engine)


class PageError(Exception):
    """The page cannot be trusted; ``reason`` is one of exposition.SCRAPE_ERROR_REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class PageLimits:
    """How much of one page the exporter takes; the rest is dropped and counted."""

    max_series: int = exposition.DEFAULT_MAX_SERIES
    max_models: int = exposition.DEFAULT_MAX_MODELS
    max_label_length: int = exposition.DEFAULT_MAX_LABEL_LENGTH
    max_buckets: int = exposition.DEFAULT_MAX_BUCKETS

    @property
    def max_block(self) -> int:
        """A label block longer than this cannot hold only short values (vLLM's have a
        handful of labels); it is dropped unparsed, so a 3 MiB label costs a len()."""
        return 16 * self.max_label_length + 256


class Admission:
    """Which (model, engine) series of a page are kept under the limits, in page order."""

    def __init__(self, limits: PageLimits) -> None:
        self.limits = limits
        self.keys: set[SeriesKey] = set()
        self.models: set[str] = set()
        self.rejected: set[SeriesKey] = set()
        self.dropped: dict[str, int] = {}

    def model_full(self, model: str) -> bool:
        return model not in self.models and len(self.models) >= self.limits.max_models

    def admit(self, key: SeriesKey) -> bool:
        if key in self.keys:
            return True
        if key in self.rejected:
            return False
        if len(self.keys) >= self.limits.max_series or self.model_full(key[0]):
            self.rejected.add(key)
            self.drop("too_many_series")
            return False
        self.keys.add(key)
        self.models.add(key[0])
        return True

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


def detect_schema(text: str) -> SourceSchema | None:
    """The first schema whose identifying sample starts a line of the page."""
    for schema in schemas.SCHEMAS:
        name = schema.detect
        for sep in ("{", " "):
            probe = name + sep
            if text.startswith(probe) or ("\n" + probe) in text:
                return schema
    return None


def select_samples(text: str, sample_names: frozenset[str]) -> list[tuple[str, str, str]]:
    """The (name, label block, rest of line) of each wanted sample line; comments dropped."""
    kept: list[tuple[str, str, str]] = []
    append = kept.append
    for line in text.split("\n"):
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace < 0:
            space = line.find(" ")
            if line[:space] in sample_names:
                append((line[:space], "", line[space:]))
            continue
        name = line[:brace]
        if name in sample_names:
            close = line.rfind("}")
            if close < brace:
                raise PageError("parse", f"unterminated label set: {line[:120]!r}")
            append((name, line[brace:close + 1], line[close + 1:]))
    return kept


class LabelCache:
    """Label blocks parsed by client_python, memoised: a target's label blocks repeat on
    every poll, so after the first poll a sample costs a dict look-up and a float()."""

    def __init__(self, max_entries: int = 20000) -> None:
        self._parsed: dict[str, dict[str, str]] = {}
        self._max = max_entries

    def parse(self, block: str) -> dict[str, str]:
        labels = self._parsed.get(block)
        if labels is None:
            if not block:
                return {}
            try:
                families = list(text_string_to_metric_families(f"m{block} 0\n"))
                labels = dict(families[0].samples[0].labels)
            except Exception as exc:
                raise PageError("parse", f"malformed labels {block[:120]!r}: {exc}") from exc
            if len(self._parsed) >= self._max:
                self._parsed.clear()
            self._parsed[block] = labels
        return labels


SHARED_LABELS = LabelCache()


def parse_value(name: str, rest: str) -> float:
    fields = rest.split()
    if not fields or len(fields) > 2:
        raise PageError("parse", f"malformed sample line for {name}: {rest[:80]!r}")
    try:
        return float(fields[0])
    except ValueError as exc:
        raise PageError("parse", f"{name}: {fields[0][:40]!r} is not a number") from exc


def quick_model(block: str) -> str | None:
    """The model_name value of a label block without parsing it (None when escaped)."""
    for probe in ('{model_name="', ',model_name="'):
        at = block.find(probe)
        if at >= 0:
            start = at + len(probe)
            end = block.find('"', start)
            value = block[start:end]
            return None if end < 0 or "\\" in value else value
    return None


def histogram_of(name: str, block: str) -> tuple[str, str] | None:
    """(name, label block without its le) of a bucket line; None for other lines."""
    if not name.endswith("_bucket"):
        return None
    for probe in ('{le="', ',le="'):
        at = block.find(probe)
        if at >= 0:
            end = block.find('"', at + len(probe))
            return name, block[:at + 1] + block[end + 1:]
    return None


def check_counter(name: str, value: float) -> None:
    """A counter is a finite count: NaN, +Inf, negative and 1e308-ish values (which overflow
    to +Inf once summed or differenced) make the whole page untrustworthy."""
    if not 0 <= value <= exposition.MAX_COUNTER_VALUE:
        raise PageError("invalid_value", f"{name} is {value:g}: a counter must be a finite "
                                         "number >= 0")
