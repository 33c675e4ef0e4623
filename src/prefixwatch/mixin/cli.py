"""`prefixwatch rules`, `dashboards` and `generate`: views of ``artifacts.render_all`` under one
mixin config.

``rules`` prints one source's rules (or the Alertmanager config), ``dashboards`` writes the
Grafana JSON, ``generate`` every committed artifact at once: alerts/ (rules, promtool tests,
alertmanager.yml), dashboards/, deploy/kubernetes/ and prometheus/prometheus.yml under
``--out``. ``render_all`` reads nothing from the source tree, so this works the same from an
installed wheel. ``generate --check`` writes nothing and exits 1 naming each file that differs:
CI runs it so a hand edit or a generator change that was not regenerated cannot land.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from prefixwatch.mixin import alertmanager, artifacts, dashboards, rules
from prefixwatch.mixin.config import MixinConfig, load_config
from prefixwatch.mixin.sources import SOURCES

log = logging.getLogger("prefixwatch.mixin")


def add_config_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="mixin config (YAML): threshold and per-model overrides, selectors, "
                        "cluster label, windows, ... (every key: "
                        "`prefixwatch example-config mixin`)")


def add_rules_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rules", help="generate Prometheus rules and Alertmanager routing",
        description="Generate recording and alerting rules for prefix-cache hit rates from the "
                    "mixin config. --source exporter reads the prefixwatch_* series; vllm and "
                    "sglang read the engine's own series, for Prometheus scraping it directly.")
    p.add_argument("--source", choices=SOURCES, default="exporter",
                   help="which series the rules read (default exporter)")
    p.add_argument("--threshold", type=float, metavar="RATIO",
                   help="hit ratio below which PrefixCacheHitRateLow fires (default: the "
                        "config's hit_ratio_threshold, else 0.7)")
    add_config_argument(p)
    p.add_argument("--alertmanager", action="store_true",
                   help="write the Alertmanager config instead (receiver URLs from "
                        f"${alertmanager.ENV_PAGER}, ${alertmanager.ENV_TICKET}, "
                        f"${alertmanager.ENV_WATCHDOG})")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--write-all", metavar="DIR",
                   help="write every source's rules, alertmanager.yml and the promtool tests "
                        "into DIR (what is committed under alerts/)")


def write_all(directory: Path, cfg: MixinConfig) -> list[Path]:
    """What is committed under alerts/, written into ``directory``."""
    return artifacts.write_files(artifacts.under(artifacts.render_all(cfg), artifacts.ALERTS_DIR),
                                 directory)


def run_rules(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.threshold)  # ConfigError: one line, exit 2
    if args.write_all:
        for path in write_all(Path(args.write_all), cfg):
            log.info("wrote %s", path)
        return 0
    text = (alertmanager.render(cfg=cfg) if args.alertmanager
            else rules.render(args.source, cfg))
    if args.out:
        artifacts.write_files({Path(args.out).name: text}, Path(args.out).parent)
    else:
        print(text, end="")
    return 0


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


def add_generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="write every generated file (rules, dashboards, manifests) at once",
        description="Write alerts/, dashboards/, deploy/kubernetes/ and prometheus/ from one mixin "
                    "config, atomically (every file staged before any is replaced). With --check, "
                    "write nothing and exit 1 naming each file that differs from what the config "
                    "generates.")
    add_config_argument(p)
    p.add_argument("--out", default=".", metavar="DIR",
                   help="directory to write under, e.g. a clone's root (default: .)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 and name each drifted file")


def run_generate(args: argparse.Namespace) -> int:
    files = artifacts.render_all(load_config(args.config))  # ConfigError: one line, exit 2
    root = Path(args.out)
    if args.check:
        stale = artifacts.drifted(files, root)
        for rel in stale:
            print(f"drifted: {rel} (run `prefixwatch generate` and commit the result)",
                  file=sys.stderr)
        if not stale:
            log.info("%d generated files match the config", len(files))
        return 1 if stale else 0
    written = artifacts.write_files(files, root)
    log.info("wrote %d files under %s", len(written), root.resolve())
    return 0
