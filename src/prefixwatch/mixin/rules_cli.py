"""`prefixwatch rules`: write the rules, the Alertmanager config and their promtool tests."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from prefixwatch.core.errors import ConfigError
from prefixwatch.mixin import alertmanager, alerttests, rules

log = logging.getLogger("prefixwatch.rules")


def add_rules_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "rules", help="generate Prometheus rules and Alertmanager routing",
        description="Generate recording and alerting rules for prefix-cache hit rates from the "
                    "catalog. --source exporter reads the prefixwatch_* series; vllm and "
                    "sglang read the engine's own series, for Prometheus scraping it directly.")
    p.add_argument("--source", choices=rules.SOURCES, default="exporter",
                   help="which series the rules read (default exporter)")
    p.add_argument("--threshold", type=float, metavar="RATIO",
                   help="hit ratio below which PrefixCacheHitRateLow fires (default 0.7)")
    p.add_argument("--config", metavar="FILE",
                   help="YAML: threshold, per-model thresholds and opt-outs, selector, "
                        "minimum traffic, ... (see alerts/rules-config.example.yml)")
    p.add_argument("--alertmanager", action="store_true",
                   help="write the Alertmanager config instead (receiver URLs from "
                        f"${alertmanager.ENV_PAGER}, ${alertmanager.ENV_TICKET}, "
                        f"${alertmanager.ENV_WATCHDOG})")
    p.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    p.add_argument("--write-all", metavar="DIR",
                   help="write every source's rules, alertmanager.yml and the promtool tests "
                        "into DIR (what is committed under alerts/)")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # never a half-written rule file for Prometheus to load
    log.info("wrote %s", path)


def write_all(directory: Path, cfg: rules.RulesConfig) -> list[Path]:
    written = []
    for source in rules.SOURCES:
        rule_name = f"prefixwatch.{source}.rules.yml"
        _write(directory / rule_name, rules.render(source, cfg))
        _write(directory / "tests" / f"prefixwatch.{source}.test.yml",
               alerttests.render(source, f"../{rule_name}", cfg))
        written += [directory / rule_name, directory / "tests" / f"prefixwatch.{source}.test.yml"]
    _write(directory / "alertmanager.yml", alertmanager.render(environ={}))
    written.append(directory / "alertmanager.yml")
    return written


def run_rules(args: argparse.Namespace) -> int:
    try:
        cfg = rules.load_config(args.config, args.threshold)
    except rules.RulesConfigError as exc:
        raise ConfigError(str(exc)) from exc
    if args.write_all:
        write_all(Path(args.write_all), cfg)
        return 0
    text = alertmanager.render() if args.alertmanager else rules.render(args.source, cfg)
    if args.out:
        _write(Path(args.out), text)
    else:
        print(text, end="")
    return 0
