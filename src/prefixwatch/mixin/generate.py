"""`prefixwatch generate`: every committed artifact from one mixin config, in one atomic pass.

Writes alerts/ (rules, promtool tests, alertmanager.yml), dashboards/, deploy/kubernetes/ and
prometheus/prometheus.yml under ``--out`` (default: the current directory) from
``artifacts.render_all``, which reads nothing from the source tree, so it works the same from an
installed wheel. ``--check`` writes nothing and exits 1 naming each file that differs: CI runs it
so a hand edit or a generator change that was not regenerated cannot land.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from prefixwatch.mixin import artifacts
from prefixwatch.mixin.config import load_config
from prefixwatch.mixin.rules_cli import add_config_argument

log = logging.getLogger("prefixwatch.generate")


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
