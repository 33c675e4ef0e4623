"""Recording rules and alerts on the exporter's KV event series: why prompt tokens were computed.

The exporter mirrors each engine's KV event stream (vLLM's ``--kv-events-config``) and counts
every device block a replica stored that no lower tier supplied, in tokens, by why it had to be
computed (``part``): ``eviction`` (that replica held the content and evicted it), ``routing``
(another replica held it), ``layout``, ``novel``, and ``tail`` (the tokens no full block
covers, a part of the same counter beside the stream's four: ``KV_COMPUTED_SERIES_PARTS`` in
core/vocab/exposition.py). These rules record the parts per model and per replica and each
part's share of the computed tokens (the five sum to 1); the alerts page a ticket when a replica
recomputes what it evicted, or a model recomputes what another replica held, for a share of its
prompt tokens at which the diagnosis names the same cause (``diagnosis.routing_gap``: one
threshold for both).

Only the exporter has these series (Prometheus cannot read a ZMQ stream): other sources get no
rules from here. Absent, not 0, for a target without an event stream.
"""

from __future__ import annotations

from typing import Any

from prefixwatch.core.vocab.exposition import (
    KV_BLOCK_OPS,
    L_MEDIUM,
    L_MODEL,
    L_OP,
    L_PART,
    L_POOL_SCALE,
    L_TARGET,
)
from prefixwatch.core.vocab.rulenames import (
    ALERT_KV_EVICTION,
    ALERT_KV_ROUTING,
    MODEL_PART,
    MODEL_TARGET_PART,
    POOL_SCALE_TODAY,
    R_KV_LOADED,
    R_KV_REMOVED,
    R_KV_STORED,
    r_kv_computed,
    r_kv_computed_share,
    r_kv_whatif_ratio,
)
from prefixwatch.mixin.promql import DASHBOARD_WINDOW, ExporterOnlyRules
from prefixwatch.mixin.sources import source

# The exporter's KV event series as Prometheus stores them, from the family table's rows.
_EXPORTER = source("exporter")
KV_COMPUTED = _EXPORTER.raw["kv_computed"]
KV_LOADED = _EXPORTER.raw["kv_loaded"]
KV_BLOCKS = _EXPORTER.raw["kv_blocks"]
KV_WHATIF = _EXPORTER.raw["kv_whatif"]


class KVRules(ExporterOnlyRules):
    """The KV event rules of one source (none but the exporter's) under one config."""

    @property
    def windows(self) -> tuple[str, ...]:
        """The recorded parts' windows: the dashboards' and the alerts' ``kv_window``."""
        return self.recorded_windows(self.cfg.kv_window)

    def computed_rate(self, w: str, *by: str) -> str:
        return (f"sum by ({self.labels(*by)}) "
                f"(rate({self.sel(KV_COMPUTED)}[{self.w(w)}]))")

    def recording(self) -> list[dict[str, Any]]:
        if not self.active:
            return []
        out: list[dict[str, Any]] = []

        def rec(name: str, expr: str) -> None:
            out.append({"record": name, "expr": expr})

        for w in self.windows:
            for level, group in ((MODEL_PART, (L_MODEL,)),
                                 (MODEL_TARGET_PART, (L_MODEL, L_TARGET))):
                rec(r_kv_computed(level, w), self.computed_rate(w, *group, L_PART))
                rec(r_kv_computed_share(level, w),
                    f"{r_kv_computed(level, w)}\n/ on ({self.labels(*group)}) group_left ()\n"
                    f"(sum by ({self.labels(*group)}) ({r_kv_computed(level, w)}) > 0)")
        w5 = self.w(DASHBOARD_WINDOW)
        rec(R_KV_LOADED, f"sum by ({self.labels(L_MODEL, L_MEDIUM)}) "
                         f"(rate({self.sel(KV_LOADED)}[{w5}]))")
        for name, op in zip((R_KV_STORED, R_KV_REMOVED), KV_BLOCK_OPS, strict=True):
            blocks = self.sel(KV_BLOCKS, f'{L_OP}="{op}"')
            rec(name, f"sum by ({self.labels(L_TARGET, L_MEDIUM)}) (rate({blocks}[{w5}]))")
        for w in self.windows:
            rec(r_kv_whatif_ratio(w), self.whatif_ratio(w))
        return out

    def whatif_ratio(self, w: str) -> str:
        """The pool what-if curve of each model over ``w``: the what-if cached tokens by
        pool_scale, and at pool_scale "1" the cached tokens (every tier), over the prompt
        tokens of the same replicas (those with a what-if counter)."""
        t = self.src.tiers
        assert t is not None
        model, win = self.labels(L_MODEL), self.w(w)
        on = f"on ({self.labels(L_TARGET, L_MODEL)})"
        whatif = self.sel(KV_WHATIF)
        followed = f"group by ({self.labels(L_TARGET, L_MODEL)}) ({whatif})"
        prompt = (f"sum by ({model}) (rate({self.sel(t.total)}[{win}]) and {on} {followed})")
        today = (f'label_replace(sum by ({model}) (rate({self.sel(t.cached)}[{win}]) '
                 f'and {on} {followed}), "{L_POOL_SCALE}", "{POOL_SCALE_TODAY}", "", "")')
        larger = f"sum by ({self.labels(L_MODEL, L_POOL_SCALE)}) (rate({whatif}[{win}]))"
        return (f"(\n  {larger}\nor\n  {today}\n)\n/ on ({model}) group_left ()\n"
                f"({prompt} > 0)")

    def prompt_rate(self, *group: str) -> str:
        """Prompt tokens per second of the group over ``kv_window`` (the engines' counter, as
        the exporter re-exposes it)."""
        t = self.src.tiers
        assert t is not None
        return (f"sum by ({self.labels(*group)}) "
                f"(rate({self.sel(t.total)}[{self.w(self.cfg.kv_window)}]))")

    def part_of_prompt(self, level: str, part: str, *group: str) -> str:
        """One part's tokens over the prompt tokens of the same group (per model, or model and
        replica), over ``kv_window``, with the hit-rate alerts' traffic floor: the shares the
        diagnosis and the ledger use."""
        prompt = self.prompt_rate(*group)
        on = f"on ({self.labels(*group)})"
        return (f'{r_kv_computed(level, self.cfg.kv_window)}{{{L_PART}="{part}"}}\n'
                f"/ {on} group_left ()\n({prompt} > 0)\n"
                f">= {self.cfg.diagnosis.thresholds.routing_gap:g}\n"
                f"and {on} {prompt} > {self.cfg.min_query_tokens_per_second:g}")

    def alerts(self, builder: Any) -> list[dict[str, Any]]:
        """``builder`` is the source's ``Alerts`` (one rule's severity, texts, runbook URL)."""
        if not self.active:
            return []
        cfg = self.cfg
        pct = "{{ $value | humanizePercentage }}"
        model, target = "{{ $labels.model_name }}", "{{ $labels.target }}"
        span = builder.span(cfg.kv_window)
        return [
            builder.alert(
                ALERT_KV_EVICTION,
                self.part_of_prompt(MODEL_TARGET_PART, "eviction", L_MODEL, L_TARGET),
                cfg.kv_for, "warning",
                f"Replica {target} ({model}) recomputes content it evicted ({pct} of prompt "
                "tokens).",
                f"Over {span}, {pct} of the prompt tokens replica {target} served for {model} "
                "were computed again although that replica had cached the same blocks before "
                "and evicted them (measured from its KV event stream: a BlockRemoved, then a "
                "BlockStored of the same content). Its KV pool is too small for the working set "
                "it is sent: prefixes are evicted between two uses, and TTFT pays for the "
                "recompute."),
            builder.alert(
                ALERT_KV_ROUTING,
                self.part_of_prompt(MODEL_PART, "routing", L_MODEL),
                cfg.kv_for, "warning",
                f"{model} recomputes prefixes another replica holds ({pct} of prompt tokens).",
                f"Over {span}, {pct} of the prompt tokens of {model} were computed on one "
                "replica while another replica of the same model held those blocks (measured "
                "from the replicas' KV event streams). The router spreads requests that share "
                "a prefix over replicas (round-robin, random): the fleet computes and stores "
                "each prefix once per replica."),
        ]
