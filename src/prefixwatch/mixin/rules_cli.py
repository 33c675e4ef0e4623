"""`prefixwatch rules`: the rules, the Alertmanager config and their promtool tests, as views of
``artifacts.render_all`` under one mixin config."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from prefixwatch.mixin import alertmanager, artifacts, rules
from prefixwatch.mixin.config import MixinConfig, load_config
from prefixwatch.mixin.sources import SOURCES

log = logging.getLogger("prefixwatch.rules")


def add_config_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="mixin config (YAML): threshold and per-model overrides, selectors, "
                        "cluster label, windows, ... (every key: alerts/mixin.example.yml)")


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
