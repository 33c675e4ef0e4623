"""The `prefixwatch` command: one console script, one sub-command per job."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from prefixwatch.core import causes, names
from prefixwatch.core.errors import ConfigError, PrefixwatchError
from prefixwatch.core.version import __version__
from prefixwatch.exporter.config import build_config

log = logging.getLogger("prefixwatch")


class OneLineParser(argparse.ArgumentParser):
    """A bad flag is one clear line on stderr and exit status 2, not a page of usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be greater than 0")
    return value


def _add_target_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", metavar="URL",
                   help=f"a /metrics URL to poll; repeat for several "
                        f"(default: ${names.ENV_TARGETS}, comma-separated, or "
                        f"{names.DEFAULT_TARGET})")
    p.add_argument("--config", metavar="FILE",
                   help=f"YAML config file (see exporter/prefixwatch.example.yml; "
                        f"default: ${names.ENV_CONFIG})")
    p.add_argument("--timeout", type=_positive_float, metavar="SECONDS",
                   help=f"per-target poll timeout (default {names.DEFAULT_TIMEOUT_SECONDS:g})")
    p.add_argument("--bearer-token-file", metavar="FILE",
                   help="send 'Authorization: Bearer <file contents>' to every target")
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle to verify HTTPS targets")
    p.add_argument("--insecure-skip-verify", action="store_true",
                   help="do not verify HTTPS certificates")
    p.add_argument("--max-body-bytes", type=int, metavar="N",
                   help=f"refuse pages larger than N bytes "
                        f"(default {names.DEFAULT_MAX_BODY_BYTES})")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="prefixwatch",
        description="Observability and alerting for the prefix cache of LLM servers "
                    "(vLLM, SGLang).")
    parser.add_argument("--version", action="version", version=f"prefixwatch {__version__}")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"],
                        help="logging level (default: info)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    exp = sub.add_parser(
        "exporter", help="run the sidecar exporter",
        description="Poll vLLM/SGLang /metrics pages and expose prefix-cache hit ratios over "
                    "time windows, normalized counters and TTFT as prefixwatch_* series.")
    _add_target_flags(exp)
    exp.add_argument("--interval", type=_positive_float, metavar="SECONDS",
                     help=f"poll interval (default {names.DEFAULT_INTERVAL_SECONDS:g})")
    exp.add_argument("--listen-address", metavar="HOST:PORT",
                     help=f"where to serve /metrics (default {names.DEFAULT_LISTEN_ADDRESS}, every "
                          "interface; 127.0.0.1:PORT keeps it on loopback)")
    exp.add_argument("--window", action="append", metavar="DURATION",
                     help=f"a window for hit ratios and TTFT quantiles, e.g. 5m; repeat "
                          f"(default {' '.join(names.DEFAULT_WINDOWS)})")
    exp.add_argument("--web-config-file", metavar="FILE",
                     help="TLS and basic auth for the exporter's own endpoint (exporter-toolkit "
                          "format; see docs/configuration.md)")
    exp.add_argument("--otlp-endpoint", metavar="URL",
                     help="also push to an OTLP/HTTP collector, e.g. http://localhost:4318")
    diag = exp.add_argument_group(
        "diagnosis", "why the hit rate is low (prefixwatch_diagnosis; docs/runbooks.md)")
    diag.add_argument("--diagnosis-window", metavar="DURATION",
                      help=f"window the causes are judged over (default "
                           f"{causes.DIAGNOSIS_WINDOW})")
    diag.add_argument("--cold-start", metavar="DURATION",
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
    diag.add_argument("--max-log-len", type=int, metavar="N",
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
    st.add_argument("--gap", type=_positive_float, default=5.0, metavar="SECONDS",
                    help="seconds between the two polls (default 5)")
    st.add_argument("--cold-start", metavar="DURATION",
                    help=f"a server that (re)started less than this ago is cold (default "
                         f"{causes.COLD_START}; `prefixwatch demo --time-scale` prints its own)")

    from prefixwatch.audit.cli import add_audit_parser
    from prefixwatch.demo import add_demo_parser
    from prefixwatch.mixin.dashboards_cli import add_dashboards_parser
    from prefixwatch.mixin.generate import add_generate_parser
    from prefixwatch.mixin.rules_cli import add_rules_parser
    from prefixwatch.simulator.cli import add_simulate_parser

    add_simulate_parser(sub)
    add_rules_parser(sub)
    add_dashboards_parser(sub)
    add_generate_parser(sub)
    add_audit_parser(sub)
    add_demo_parser(sub)
    from prefixwatch.report.cli import add_report_parser

    add_report_parser(sub)
    parser.set_defaults(_subparsers=sub.choices)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Like parse_args, but a flag the sub-command does not know is reported by that
    sub-command's parser, so the message points at its --help, not the top-level one."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = args._subparsers.get(args.command, parser)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _config_from(args: argparse.Namespace, with_exporter_flags: bool):
    kwargs = dict(
        targets=args.target, config_file=args.config, timeout=args.timeout,
        bearer_token_file=args.bearer_token_file, ca_file=args.ca_file,
        insecure_skip_verify=args.insecure_skip_verify, max_body_bytes=args.max_body_bytes,
    )
    if not with_exporter_flags and getattr(args, "cold_start", None):
        kwargs["cold_start"] = args.cold_start
    if with_exporter_flags:
        kwargs.update(interval=args.interval, listen_address=args.listen_address,
                      windows=args.window, otlp_endpoint=args.otlp_endpoint,
                      web_config_file=args.web_config_file,
                      diagnosis_window=args.diagnosis_window, cold_start=args.cold_start)
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

        bridge = OtlpBridge(exporter.monitors, config.otlp_endpoint, state=exporter.state)
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


def run_status(args: argparse.Namespace) -> int:
    from prefixwatch.exporter.status import collect_status, ledger_status, render

    config = _config_from(args, with_exporter_flags=False)
    rows = collect_status(config, args.gap)
    print(render(rows, args.gap))
    print("\n".join(ledger_status(config, rows)))
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
    logging.basicConfig(level=getattr(logging, args.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    commands = {"exporter": run_exporter, "status": run_status}
    from prefixwatch.audit.cli import run_audit
    from prefixwatch.demo import run_demo
    from prefixwatch.mixin.dashboards_cli import run_dashboards
    from prefixwatch.mixin.generate import run_generate
    from prefixwatch.mixin.rules_cli import run_rules
    from prefixwatch.simulator.cli import run_simulate

    commands["simulate"] = run_simulate
    commands["rules"] = run_rules
    commands["dashboards"] = run_dashboards
    commands["generate"] = run_generate
    commands["audit"] = run_audit
    commands["demo"] = run_demo
    commands["report"] = run_report
    try:
        code = commands[args.command](args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except PrefixwatchError as exc:
        print(f"prefixwatch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        return 130


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
