"""`prefixwatch dashboards`: the Grafana dashboards' JSON, a view of ``artifacts.render_all``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from prefixwatch.mixin import artifacts, dashboards
from prefixwatch.mixin.config import load_config
from prefixwatch.mixin.rules_cli import add_config_argument
from prefixwatch.mixin.sources import SOURCES

log = logging.getLogger("prefixwatch.dashboards")


def add_dashboards_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboards", help="generate the Grafana dashboards (JSON)",
        description="Build the overview and replica drill-down dashboards with grafanalib and "
                    "write deterministic JSON (stable uids, sorted keys).")
    p.add_argument("--out", default=artifacts.DASHBOARDS_DIR, metavar="DIR",
                   help="directory to write to (default: dashboards)")
    p.add_argument("--source", choices=(*SOURCES, "all"), default="all",
                   help="the exporter's prefixwatch_* series, or vLLM's or SGLang's own "
                        "(default: all, as committed under dashboards/)")
    add_config_argument(p)
    p.add_argument("--datasource", metavar="UID",
                   help="preselect this Prometheus datasource uid (default: Grafana's default)")


def run_dashboards(args: argparse.Namespace) -> int:
    cfg = load_config(getattr(args, "config", None))
    sources = SOURCES if args.source == "all" else (args.source,)
    files = dashboards.render_all(cfg, sources, args.datasource)
    for path in artifacts.write_files(files, Path(args.out)):
        log.info("wrote %s", path)
    return 0
