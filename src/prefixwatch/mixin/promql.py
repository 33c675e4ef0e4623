"""PromQL building blocks shared by the rules and the dashboards: selectors, windows, and the
label lists of every aggregation (so a cluster label reaches each ``by``/``on`` at once)."""

from __future__ import annotations

from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.sources import Source, source

_REGEX_SPECIAL = set(".^$*+?()[]{}|\\")


def promql_regex_literal(values: list[str]) -> str:
    """An alternation matching exactly these values, as the body of a PromQL string."""
    def one(value: str) -> str:
        out = []
        for ch in value:
            if ch in _REGEX_SPECIAL:
                out.append("\\\\" + ch)  # a backslash for the regex, escaped for PromQL
            elif ch == '"':
                out.append('\\"')
            else:
                out.append(ch)
        return "".join(out)
    return "|".join(one(v) for v in values)


def promql_string(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


class Exprs:
    """Expressions for one source under one config."""

    def __init__(self, source_name: str, cfg: MixinConfig) -> None:
        self.src: Source = source(source_name)
        self.cfg = cfg

    def labels(self, *names: str) -> str:
        """A label list for by()/on(), led by the cluster label when there is one."""
        cluster = (self.cfg.cluster_label,) if self.cfg.cluster_label else ()
        return ", ".join((*cluster, *names))

    def sel(self, metric: str) -> str:
        selector = self.cfg.selector
        return f"{metric}{{{selector}}}" if selector else metric

    def w(self, window: str) -> str:
        return self.cfg.scaled(window)
