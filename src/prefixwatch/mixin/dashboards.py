"""Grafana dashboards, generated with grafanalib from the source table and the recording rules.

Two dashboards per source: the on-call *overview* (is the prefix cache working, since when not,
on which model and replica, and what it costs in TTFT) and a *replica* drill-down. The exporter's
``prefixwatch_*`` series are the default source; ``vllm`` and ``sglang`` read the engines' own
series. Panels come from ``panels.py``, their places from ``grid.py`` (no hand-counted ids or
x/y) and the JSON from ``grafanajson.py``. Every number and text follows the MixinConfig, and
with a cluster label every query is scoped by a ``cluster`` variable.
"""

from __future__ import annotations

from pathlib import Path

from grafanalib import core as g

from prefixwatch.mixin import grid
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.grafanajson import SCHEMA_VERSION, normalize, queries, to_json  # noqa: F401
from prefixwatch.mixin.panelbase import DATASOURCE
from prefixwatch.mixin.panels import Panels
from prefixwatch.mixin.sources import SOURCES, Source, source  # noqa: F401


def _templating(p: Panels) -> g.Templating:
    s, cfg, one = p.s, p.cfg, p.one
    ds = DATASOURCE
    cluster = cfg.cluster_label
    scope = [f'{cluster}=~"$cluster"'] if cluster else []
    if cfg.job:
        scope.append(f'job=~"{cfg.job}"')
    if cfg.matchers.strip():
        scope.append(cfg.matchers.strip().rstrip(","))
    jobs = f"{s.queries}{{{','.join(scope)}}}" if scope else s.queries
    within = ",".join([*([f'{cluster}=~"$cluster"'] if cluster else []), 'job=~"$job"'])
    variables = [g.Template(name="datasource", label="Data source", query="prometheus",
                            type="datasource", default="Prometheus", hide=0)]
    if cluster:
        variables.append(g.Template(
            name="cluster", label="Cluster", dataSource=ds, type="query",
            query=f"label_values({s.queries}, {cluster})", includeAll=False, multi=False,
            refresh=2, sort=1))
    variables += [
        g.Template(name="job", label="Job", dataSource=ds, type="query",
                   query=f"label_values({jobs}, job)", includeAll=True, multi=True,
                   allValue=".*", refresh=2, sort=1, default="$__all"),
        g.Template(name="model", label="Model", dataSource=ds, type="query",
                   query=f"label_values({s.queries}{{{within}}}, model_name)", includeAll=True,
                   multi=not one, allValue=".*", refresh=2, sort=1, default="$__all"),
        g.Template(name="instance", label="Replica", dataSource=ds, type="query",
                   query=f'label_values({s.queries}{{{within},model_name=~"$model"}}, '
                         f'{s.replica_label})',
                   includeAll=not one, multi=not one, allValue=".*", refresh=2,
                   sort=1, default="" if one else "$__all"),
    ]
    return g.Templating(list=variables)


def _links(cfg: MixinConfig) -> list[g.DashboardLink]:
    return [
        g.DashboardLink(title="Runbooks", uri=cfg.runbook_home, type="link", icon="doc",
                        targetBlank=True, tooltip="What each alert means and how to fix it"),
        g.DashboardLink(title="prefixwatch dashboards", type="dashboards", tags=["prefixwatch"],
                        asDropdown=True, includeVars=True, keepTime=True),
    ]


def overview(source_name: str = "exporter", cfg: MixinConfig | None = None) -> g.Dashboard:
    p = Panels(source(source_name), cfg or MixinConfig(), one_replica=False)
    p.hit_rate_now()
    p.ttft_now()
    p.tokens_saved()
    p.firing_alerts()
    p.hit_rate_vs_ttft()
    p.tier_share()
    p.hit_rate_over_time()
    p.why_computed()
    p.cached_vs_computed()
    p.per_replica()
    p.kv_and_pressure()
    p.prompt_length()
    if source_name == "exporter":
        p.why_low()
        p.achievable_vs_achieved()
        p.where_misses_go()
    p.capacity()
    p.external_cache()
    p.scrape_health(w=24)
    return _dashboard("overview", "Prefix cache overview", p,
                      "Is the prefix cache working, since when not, on which model and "
                      "replica, and what it costs in TTFT.")


def replica(source_name: str = "exporter", cfg: MixinConfig | None = None) -> g.Dashboard:
    p = Panels(source(source_name), cfg or MixinConfig(), one_replica=True)
    p.hit_rate_now(w=8)
    p.ttft_now(w=8)
    p.tokens_saved(w=8)
    p.hit_rate_vs_ttft()
    p.why_computed()
    p.tier_share()
    p.cached_vs_computed()
    p.kv_and_pressure()
    p.prompt_length()
    p.requests()
    p.external_cache()
    p.scrape_health()
    return _dashboard("replica", "Replica drill-down", p,
                      "The prefix-cache signals of one replica, chosen with the Replica "
                      "variable.")


def _dashboard(kind: str, title: str, p: Panels, description: str) -> g.Dashboard:
    name = p.s.name
    suffix = "" if name == "exporter" else f" ({name} series)"
    settings = p.cfg.dashboards
    dashboard = g.Dashboard(
        title=f"prefixwatch / {title}{suffix}",
        uid=f"prefixwatch-{kind}{'' if name == 'exporter' else '-' + name}",
        description=description, tags=["prefixwatch", p.s.engine, "prefix-cache"],
        panels=grid.flow(p.placed), links=_links(p.cfg), templating=_templating(p),
        refresh=settings.refresh, time=g.Time(settings.time_from, settings.time_to),
        timezone=settings.timezone, graphTooltip=1)
    return dashboard.auto_panel_ids()


def file_name(kind: str, source_name: str) -> str:
    return f"prefixwatch-{kind}{'' if source_name == 'exporter' else '-' + source_name}.json"


def all_dashboards(source_name: str = "exporter", cfg: MixinConfig | None = None
                   ) -> dict[str, g.Dashboard]:
    return {file_name("overview", source_name): overview(source_name, cfg),
            file_name("replica", source_name): replica(source_name, cfg)}


def render_all(cfg: MixinConfig, sources: tuple[str, ...] = SOURCES,
               datasource_uid: str | None = None) -> dict[str, str]:
    """{file name: JSON text} of every dashboard of these sources."""
    return {name: to_json(dash, datasource_uid) for src in sources
            for name, dash in all_dashboards(src, cfg).items()}


def write(directory: Path, source_name: str = "exporter", datasource_uid: str | None = None,
          cfg: MixinConfig | None = None) -> list[Path]:
    """Write one source's dashboards (atomically, file by file)."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all(cfg or MixinConfig(), (source_name,), datasource_uid).items():
        path = directory / name
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        written.append(path)
    return written
