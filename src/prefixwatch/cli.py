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
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from prefixwatch.core import cliargs
from prefixwatch.core.errors import ConfigError, PrefixwatchError
from prefixwatch.core.version import __version__
from prefixwatch.core.vocab import causes, exposition, rulenames

log = logging.getLogger("prefixwatch")

# The products' sub-commands: name -> (one-line help, module, parser builder, runner). The help
# is the module's own (tests/test_cli.py checks they agree); a runner of None: run_<name> here.
PRODUCT_COMMANDS: dict[str, tuple[str, str, str, str | None]] = {
    "demo": ("start here: the whole stack on this machine, without Docker",
             "prefixwatch.demo", "add_demo_parser", "run_demo"),
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


#: The example configurations shipped inside the package (`prefixwatch example-config`).
EXAMPLES = {"exporter": "exporter.example.yml", "mixin": "mixin.example.yml"}
#: Where the documentation lives: help texts point there, not to files of the repository,
#: which an installed package does not have.
DOCS = rulenames.DEFAULT_RUNBOOK_URL.rsplit("/", 1)[0]
#: Options of the top-level parser that may also follow the sub-command, with their values.
GLOBAL_OPTIONS = ("--log-level",)


def _add_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", metavar="URL", dest="targets",
                   help=f"a /metrics URL to poll; repeat for several "
                        f"(default: ${exposition.ENV_TARGETS}, comma-separated, or "
                        f"{exposition.DEFAULT_TARGET})")
    p.add_argument("--config", metavar="FILE", dest="config_file",
                   help=f"YAML config file (every key: `prefixwatch example-config "
                        f"exporter`; default: ${exposition.ENV_CONFIG})")
    p.add_argument("--timeout", type=cliargs.duration, metavar="DURATION",
                   help=f"per-target poll timeout (default {exposition.DEFAULT_TIMEOUT_SECONDS:g})")
    p.add_argument("--bearer-token-file", metavar="FILE",
                   help="send 'Authorization: Bearer <file contents>' to every target")
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify HTTPS targets")
    p.add_argument("--insecure-skip-verify", action="store_true",
                   help="do not verify HTTPS certificates")
    p.add_argument("--kv-events", metavar="ENDPOINT",
                   help="the engine's KV event stream (vLLM --kv-events-config endpoint), "
                        "e.g. tcp://localhost:5557, for the one target; several targets: "
                        "kv_events per target in the config file")
    p.add_argument("--max-body-bytes", type=cliargs.count, metavar="N",
                   help=f"refuse pages larger than N bytes "
                        f"(default {exposition.DEFAULT_MAX_BODY_BYTES})")


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
    demo_help, demo_module, demo_builder, _ = PRODUCT_COMMANDS["demo"]
    sub.add_lazy("demo", demo_help, demo_module, demo_builder)

    exp = sub.add_parser(
        "exporter", help="run the sidecar exporter",
        description="Poll vLLM/SGLang /metrics pages and expose prefix-cache hit ratios over "
                    "time windows, normalized counters and TTFT as prefixwatch_* series.")
    _add_target_flags(exp)
    exp.add_argument("--interval", type=cliargs.duration, metavar="DURATION",
                     help=f"poll interval (default {exposition.DEFAULT_INTERVAL_SECONDS:g})")
    exp.add_argument("--listen-address", metavar="HOST:PORT",
                     help="where to serve /metrics (default "
                          f"{exposition.DEFAULT_LISTEN_ADDRESS}, every interface; "
                          "127.0.0.1:PORT keeps it on loopback)")
    exp.add_argument("--window", action="append", metavar="DURATION", dest="windows",
                     type=cliargs.duration_text,
                     help=f"a window for hit ratios and TTFT quantiles, e.g. 5m; repeat "
                          f"(default {' '.join(exposition.DEFAULT_WINDOWS)})")
    exp.add_argument("--web-config-file", metavar="FILE",
                     help="TLS and basic auth for the exporter's own endpoint (exporter-toolkit "
                          f"format; see {DOCS}/configuration.md)")
    exp.add_argument("--otlp-endpoint", metavar="URL",
                     help="also push to an OTLP/HTTP collector, e.g. http://localhost:4318")
    diag = exp.add_argument_group(
        "diagnosis", f"why the hit rate is low (prefixwatch_diagnosis; {DOCS}/runbooks.md)")
    diag.add_argument("--diagnosis-window", metavar="DURATION", type=cliargs.duration_text,
                      help=f"window the causes are judged over (default "
                           f"{causes.DIAGNOSIS_WINDOW})")
    diag.add_argument("--cold-start", metavar="DURATION", type=cliargs.duration_text,
                      help=f"a server that (re)started less than this ago is cold "
                           f"(default {causes.COLD_START})")
    diag.add_argument("--requests-log", metavar="PATH",
                      help="opt-in request-level view: a JSONL request log (as `audit` reads) "
                           "or vLLM's own log with --enable-log-requests and "
                           "VLLM_LOGGING_LEVEL=DEBUG (vLLM 0.33 and the older one-line form)")
    diag.add_argument("--follow", action="store_true", default=None,
                      help="follow the requests log as it grows (tail -F: rotation and "
                           "truncation handled); without it the file is read once")
    diag.add_argument("--requests-tokenizer", metavar="SPEC",
                      help="tokenizer for text requests and divergence kinds: 'server' (the "
                           "first target's /tokenize, default), a URL, a Hugging Face "
                           "tokenizer directory, 'builtin' (the simulator's) or 'none'")
    diag.add_argument("--max-log-len", type=cliargs.count, metavar="N",
                      help="the server's --max-log-len: logged token ids of N are cut "
                           "(counted as truncated)")
    diag.add_argument("--requests-model", metavar="NAME",
                      help="the model the requests log belongs to (default: every model)")

    st = sub.add_parser(
        "status", help="one-shot view of the prefix cache, without Prometheus",
        description="Poll each target twice, a few seconds apart, and print the hit ratio over "
                    "that gap and over the server's lifetime, query rate, TTFT, KV usage, and "
                    "why the hit rate is low (the exporter's diagnosis rules, over the gap).")
    _add_target_flags(st)
    st.add_argument("--gap", type=cliargs.duration, default=5.0, metavar="DURATION",
                    help="time between the two polls (default 5s)")
    st.add_argument("--cold-start", metavar="DURATION", type=cliargs.duration_text,
                    help=f"a server that (re)started less than this ago is cold (default "
                         f"{causes.COLD_START}; `prefixwatch demo --time-scale` prints its own)")

    for name, (summary, module, builder, _) in PRODUCT_COMMANDS.items():
        if name != "demo":
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
        name = arg.split("=", 1)[0]
        if name in GLOBAL_OPTIONS:
            take = 1 if "=" in arg or i + 1 >= len(argv) else 2
            front += argv[i:i + take]
            i += take
            continue
        rest.append(arg)
        i += 1
    return front + rest


#: Flags that are build_config's keywords of the same name: the target flags and --cold-start,
#: and the exporter's own.
_CONFIG_FLAGS = ("targets", "config_file", "timeout", "bearer_token_file", "ca_file",
                 "insecure_skip_verify", "max_body_bytes", "kv_events", "cold_start")
_EXPORTER_FLAGS = ("interval", "listen_address", "windows", "otlp_endpoint", "web_config_file",
                   "diagnosis_window")


def _config_from(args: argparse.Namespace, with_exporter_flags: bool):
    from prefixwatch.exporter.config import build_config

    flags = _CONFIG_FLAGS + (_EXPORTER_FLAGS if with_exporter_flags else ())
    kwargs = {flag: getattr(args, flag) for flag in flags}
    if with_exporter_flags:
        log_flags = {"follow": args.follow, "tokenizer": args.requests_tokenizer,
                     "max_log_len": args.max_log_len, "model": args.requests_model}
        if args.requests_log:
            kwargs["requests_log"] = {"path": args.requests_log, **log_flags}
        elif any(v is not None for v in log_flags.values()):
            raise ConfigError("--follow, --requests-tokenizer, --max-log-len and "
                              "--requests-model go with --requests-log PATH")
    return build_config(**kwargs)


def run_exporter(args: argparse.Namespace) -> int:
    from prefixwatch.exporter.service import Exporter

    config = _config_from(args, with_exporter_flags=True)
    exporter = Exporter(config)
    bridge = None
    if config.otlp_endpoint:
        from prefixwatch.exporter.otlp import OtlpBridge

        bridge = OtlpBridge(exporter.collector, config.otlp_endpoint)
        exporter.round_listeners.append(bridge.export)
        log.info("exporting to OTLP/HTTP at %s after each poll round", bridge.endpoint)
    try:
        exporter.start()
    except OSError as exc:
        raise ConfigError(f"cannot listen on {config.listen_address}: {exc.strerror}") from exc
    _stop_on_signals(exporter.stop)
    exporter.wait()
    if bridge is not None:
        bridge.shutdown()
    log.info("stopped")
    return 0


def run_report(args: argparse.Namespace) -> int:
    """The report reads what pages under the mixin config (--config, else the defaults): its
    threshold (--threshold wins), its ratio and the critical alert's short window."""
    from prefixwatch.mixin.config import MixinConfig, load_config
    from prefixwatch.report.cli import Paging
    from prefixwatch.report.cli import run_report as write

    cfg = load_config(args.config) if args.config else MixinConfig()  # ConfigError: exit 2
    return write(args, Paging(cfg.hit_ratio_threshold if args.threshold is None
                              else args.threshold, cfg.hit_ratio, cfg.critical_short_window,
                              cfg.time_scale))


def run_example_config(args: argparse.Namespace) -> int:
    from importlib.resources import files

    sys.stdout.write(files("prefixwatch").joinpath("examples", EXAMPLES[args.which])
                     .read_text(encoding="utf-8"))
    return 0


def run_status(args: argparse.Namespace) -> int:
    from prefixwatch.exporter.status import (
        collect_status,
        event_ledger_status,
        ledger_status,
        log_culprits,
        render,
    )

    config = _config_from(args, with_exporter_flags=False)
    events = event_ledger_status(config)  # follows the streams through the gap
    story = events.story if events is not None else (
        (lambda: ({}, log_culprits(config, []))) if config.requests_log else None)
    rows = collect_status(config, args.gap, story)
    print(render(rows, args.gap, config.hit_ratio_mode))
    print("\n".join(events.finish() if events is not None else ledger_status(config, rows)))
    return 1 if any(r.error for r in rows) else 0


def _stop_on_signals(stop) -> None:
    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


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
    local = {"exporter": run_exporter, "status": run_status, "report": run_report,
             "example-config": run_example_config}
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
