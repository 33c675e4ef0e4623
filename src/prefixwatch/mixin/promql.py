"""PromQL building blocks shared by the rules and the dashboards: selectors, windows, and the
label lists of every aggregation (so a cluster label reaches each ``by``/``on`` at once)."""

from __future__ import annotations

from collections.abc import Callable

from prefixwatch.core.vocab.exposition import L_TIER
from prefixwatch.core.vocab.tiers import TIER_UNKNOWN
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.sources import Source, TierSeries, source

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


def tier_rates(t: TierSeries, rate: Callable[[str, str], str], by: Callable[[str], str],
               on: str) -> str:
    """Cached prompt tokens per second by tier: the engine's split mapped to prefixwatch's
    tiers (a label_replace chain, the last matching regex wins), or, for a group without it,
    the fallback counters. ``rate(metric, matchers)`` reads a counter, ``by`` aggregates by
    the group's labels and ``tier``, ``on`` lists the group's labels."""
    if t.mapping:
        main = f'label_replace({rate(t.cached, "")}, "{L_TIER}", "{TIER_UNKNOWN}", "", "")'
        for regex, tier in t.mapping:
            main = f'label_replace({main}, "{L_TIER}", "{tier}", "{t.label}", "{regex}")'
    else:
        main = rate(t.cached, f'{t.label}=~".+"')
    primary = by(main)
    if not t.fallback:
        return primary
    alts = "\nor\n".join(by(f'label_replace({rate(metric, "")}, "{L_TIER}", "{tier}", "", "")')
                          for metric, tier in t.fallback)
    return f"{primary}\nor\n(\n({alts})\nunless on ({on})\n{primary}\n)"


class Exprs:
    """Expressions for one source under one config."""

    def __init__(self, source_name: str, cfg: MixinConfig) -> None:
        self.src: Source = source(source_name)
        self.cfg = cfg

    def labels(self, *names: str) -> str:
        """A label list for by()/on(), led by the cluster label when there is one."""
        cluster = (self.cfg.cluster_label,) if self.cfg.cluster_label else ()
        return ", ".join((*cluster, *names))

    def sel(self, metric: str, extra: str = "") -> str:
        parts = [p for p in (self.cfg.selector, extra) if p]
        return f"{metric}{{{','.join(parts)}}}" if parts else metric

    def hits_sel(self) -> str:
        """The device tier's hits counter, with its matchers (SGLang's device source)."""
        return self.sel(self.src.hits, self.src.hits_matchers)

    def w(self, window: str) -> str:
        return self.cfg.scaled(window)


#: The window the dashboards read the exporter-only recorded series over (KV events,
#: routers); always recorded beside the window their alerts judge.
DASHBOARD_WINDOW = "5m"


class ExporterOnlyRules(Exprs):
    """Rules of series only the exporter writes (its KV event streams, the routers it
    polls): none for a source that scrapes an engine directly."""

    @property
    def active(self) -> bool:
        return self.src.name == "exporter"

    @staticmethod
    def recorded_windows(alert_window: str) -> tuple[str, ...]:
        """The dashboards' window and the alerts' own, once each."""
        return tuple(dict.fromkeys((DASHBOARD_WINDOW, alert_window)))
