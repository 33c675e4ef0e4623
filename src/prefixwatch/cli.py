"""The `prefixwatch` command: one console script, one sub-command per job.

Every command pays its imports before it does anything (the exporter's start, each `status`
run, a container restarted by its healthcheck), so this module imports only the light parts of
core. A product's sub-command parser is built from its own module only when that sub-command
is chosen (`LazySubcommands`); `prefixwatch --help` lists them all from the table below
without importing any (`benchmarks/bench_startup.py` measures it).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from prefixwatch.core.errors import PrefixwatchError
from prefixwatch.core.version import __version__

log = logging.getLogger("prefixwatch")

# The products' sub-commands: name -> (one-line help, module, parser builder, runner). The help
# is the module's own (tests/test_cli.py checks they agree); a runner of None: run_<name> here.
PRODUCT_COMMANDS: dict[str, tuple[str, str, str, str | None]] = {
    "demo": ("start here: the whole stack on this machine, without Docker",
             "prefixwatch.demo", "add_demo_parser", "run_demo"),
    "exporter": ("run the sidecar exporter",
                 "prefixwatch.exporter.cli", "add_exporter_parser", "run_exporter"),
    "status": ("one-shot view of the prefix cache, without Prometheus",
               "prefixwatch.exporter.cli", "add_status_parser", "run_status"),
    "simulate": ("serve simulated vLLM replicas with a built-in workload",
                 "prefixwatch.simulator.cli", "add_simulate_parser", "run_simulate"),
    "rules": ("generate Prometheus rules and Alertmanager routing",
              "prefixwatch.mixin.cli", "add_rules_parser", "run_rules"),
    "dashboards": ("generate the Grafana dashboards (JSON)",
                   "prefixwatch.mixin.cli", "add_dashboards_parser", "run_dashboards"),
    "generate": ("write every generated file (rules, dashboards, manifests) at once",
                 "prefixwatch.mixin.cli", "add_generate_parser", "run_generate"),
    "audit": ("find where prompts stop sharing a prefix in a request log",
              "prefixwatch.audit.cli", "add_audit_parser", "run_audit"),
    "report": ("write an incident report (HTML, Markdown, figures) from Prometheus",
               "prefixwatch.report.cli", "add_report_parser", None),
}


#: The example configurations shipped inside the package (`prefixwatch example-config`).
EXAMPLES = {"exporter": "exporter.example.yml", "mixin": "mixin.example.yml"}
#: Options of the top-level parser that may also follow the sub-command, with their values.
GLOBAL_OPTIONS = ("--log-level",)


class LazySubcommands(argparse._SubParsersAction):
    """Sub-commands whose parser is built when the sub-command is chosen.

    `add_lazy` lists a placeholder with the sub-command's help; when argparse reaches that
    sub-command, the placeholder is replaced by the parser its module builds (so
    `prefixwatch audit --help` imports the audit product and nothing else)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy: dict[str, tuple[str, str]] = {}

    def add_lazy(self, name: str, help: str, module: str, builder: str) -> None:  # noqa: A002
        self.add_parser(name, help=help)
        self._lazy[name] = (module, builder)

    def build(self, name: str) -> argparse.ArgumentParser:
        """The real parser of a sub-command (imports its module the first time)."""
        if name in self._lazy:
            module, builder = self._lazy.pop(name)
            placeholder = self._name_parser_map.pop(name)
            at = next(i for i, a in enumerate(self._choices_actions) if a.dest == name)
            del self._choices_actions[at]
            listed = len(self._choices_actions)
            getattr(importlib.import_module(module), builder)(self)
            if len(self._choices_actions) > listed:  # keep the listing's order
                self._choices_actions.insert(at, self._choices_actions.pop())
            return self._name_parser_map.setdefault(name, placeholder)
        return self._name_parser_map[name]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if values and values[0] in self._lazy:
            self.build(values[0])
        super().__call__(parser, namespace, values, option_string)


class OneLineParser(argparse.ArgumentParser):
    """A bad flag is one clear line on stderr and exit status 2, not a page of usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="prefixwatch",
        description="Observability and alerting for the prefix cache of LLM servers "
                    "(vLLM, SGLang). Start here: prefixwatch demo --time-scale 0.05 (the whole "
                    "stack on this machine; the page within about a minute).",
        epilog="Durations are 30s, 5m, 1h or a bare number of seconds. Global options "
               "(--log-level) go before or after the command.")
    parser.add_argument("--version", action="version", version=f"prefixwatch {__version__}")
    parser.add_argument("--log-level", default=None,
                        choices=["debug", "info", "warning", "error"],
                        help="logging level (default: info; warning for status, whose table "
                             "is the output)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True,
                                action=LazySubcommands)

    for name, (summary, module, builder, _) in PRODUCT_COMMANDS.items():
        sub.add_lazy(name, summary, module, builder)
    ex = sub.add_parser(
        "example-config", help="print an example configuration file, every key commented",
        description="Print the example exporter config (--config of exporter and status) or "
                    "mixin config (--config of rules, dashboards, generate and report), every "
                    "key commented, to start your own from.",
        epilog="Example: prefixwatch example-config exporter > prefixwatch.yml")
    ex.add_argument("which", choices=sorted(EXAMPLES), help="which configuration")
    parser.set_defaults(_subparsers=sub.choices)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Like parse_args, but a flag the sub-command does not know is reported by that
    sub-command's parser, so the message points at its --help, not the top-level one."""
    args, extra = parser.parse_known_args(_globals_first(
        list(sys.argv[1:] if argv is None else argv)))
    if extra:
        sub = args._subparsers.get(args.command, parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _globals_first(argv: list[str]) -> list[str]:
    """The global options moved before the sub-command, so that `prefixwatch exporter
    --log-level warning` means what `prefixwatch --log-level warning exporter` does."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg.split("=", 1)[0] in GLOBAL_OPTIONS:
            take = 1 if "=" in arg or i + 1 >= len(argv) else 2
            front += argv[i:i + take]
            i += take
            continue
        rest.append(arg)
        i += 1
    return front + rest


def run_example_config(args: argparse.Namespace) -> int:
    from importlib.resources import files

    sys.stdout.write(files("prefixwatch").joinpath("examples", EXAMPLES[args.which])
                     .read_text(encoding="utf-8"))
    return 0


def run_report(args: argparse.Namespace) -> int:
    """The report reads what pages under the mixin config (--config, else the defaults): its
    threshold (--threshold wins), its ratio and the critical alert's short window."""
    from prefixwatch.mixin.config import MixinConfig, load_config
    from prefixwatch.report.cli import Paging, report_on_paging

    cfg = load_config(args.config) if args.config else MixinConfig()  # ConfigError: exit 2
    return report_on_paging(args, Paging(cfg.hit_ratio_threshold if args.threshold is None
                              else args.threshold, cfg.hit_ratio, cfg.critical_short_window,
                              cfg.time_scale))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    level = args.log_level or ("warning" if args.command == "status" else "info")
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = _runner(args.command)(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except PrefixwatchError as exc:
        print(f"prefixwatch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        return 130


def _runner(command: str) -> Callable[[argparse.Namespace], int]:
    """The function that runs a sub-command (a product's is imported from its module)."""
    local = {"report": run_report, "example-config": run_example_config}
    if command in local:
        return local[command]
    _, module, _, runner = PRODUCT_COMMANDS[command]
    assert runner is not None, f"{command} is run here, so it is listed in `local`"
    return getattr(importlib.import_module(module), runner)


def _quiet_broken_pipe() -> int:
    """The reader went away (`prefixwatch ... | head`): that is the reader's choice, not an
    error; stdout is pointed at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
