"""`prefixwatch dashboards`: write the Grafana dashboards' JSON."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from prefixwatch.mixin import dashboards

log = logging.getLogger("prefixwatch.dashboards")


def add_dashboards_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "dashboards", help="generate the Grafana dashboards (JSON)",
        description="Build the overview and replica drill-down dashboards with grafanalib and "
                    "write deterministic JSON (stable uids, sorted keys).")
    p.add_argument("--out", default="dashboards", metavar="DIR",
                   help="directory to write to (default: dashboards)")
    p.add_argument("--source", choices=dashboards.SOURCES, default="exporter",
                   help="read the exporter's prefixwatch_* series (default) or vLLM's own")
    p.add_argument("--datasource", metavar="UID",
                   help="preselect this Prometheus datasource uid (default: Grafana's default)")


def run_dashboards(args: argparse.Namespace) -> int:
    for path in dashboards.write(Path(args.out), args.source, args.datasource):
        log.info("wrote %s", path)
    return 0
