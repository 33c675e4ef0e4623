"""`prefixwatch exporter` and `prefixwatch status`: their flags and their runs.

Building the parsers imports only the light parts of core (`prefixwatch exporter --help` pays
for nothing else); the exporter itself is imported when a command runs. The parsed flags reach
``build_config`` as one ``ConfigFlags`` value.
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

from prefixwatch.core import cliargs
from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab import causes, exposition, rulenames

if TYPE_CHECKING:
    from prefixwatch.exporter.config import ConfigFlags, ExporterConfig

log = logging.getLogger("prefixwatch")


#: Where the documentation lives: help texts point there, not to files of the repository,
#: which an installed package does not have.
DOCS = rulenames.DEFAULT_RUNBOOK_URL.rsplit("/", 1)[0]


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


def add_exporter_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
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
    _add_diagnosis_flags(exp)
    return exp


def _add_diagnosis_flags(exp: argparse.ArgumentParser) -> None:
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


def add_status_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
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
    return st


#: The request-log flags: the requests_log section's key each one sets.
_LOG_FLAGS = {"follow": "follow", "requests_tokenizer": "tokenizer",
              "max_log_len": "max_log_len", "requests_model": "model"}


def config_flags(args: argparse.Namespace) -> ConfigFlags:
    """The parsed flags of `exporter` or `status` as one value (status has fewer: the ones
    it lacks stay unset)."""
    from dataclasses import fields

    from prefixwatch.exporter.config import ConfigFlags

    given = {f.name: getattr(args, f.name) for f in fields(ConfigFlags)
             if f.name != "requests_log" and hasattr(args, f.name)}
    if hasattr(args, "requests_log"):
        log_flags = {key: getattr(args, flag) for flag, key in _LOG_FLAGS.items()}
        if args.requests_log:
            given["requests_log"] = {"path": args.requests_log, **log_flags}
        elif any(v is not None for v in log_flags.values()):
            raise ConfigError("--follow, --requests-tokenizer, --max-log-len and "
                              "--requests-model go with --requests-log PATH")
    return ConfigFlags(**given)


def config_from(args: argparse.Namespace) -> ExporterConfig:
    """The exporter's config from the parsed flags, the file and the environment."""
    from prefixwatch.exporter.config import build_config

    return build_config(config_flags(args))


def run_exporter(args: argparse.Namespace) -> int:
    from prefixwatch.exporter.service import Exporter

    config = config_from(args)
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


def run_status(args: argparse.Namespace) -> int:
    from prefixwatch.exporter.status import (
        collect_status,
        event_ledger_status,
        ledger_status,
        log_culprits,
        render,
    )

    config = config_from(args)
    events = event_ledger_status(config)  # follows the streams through the gap
    story = events.story if events is not None else (
        (lambda: ({}, log_culprits(config, []))) if config.requests_log else None)
    rows = collect_status(config, args.gap, story)
    print(render(rows, args.gap, config.hit_ratio_mode))
    print("\n".join(events.finish() if events is not None else ledger_status(config, rows)))
    return 1 if any(r.error for r in rows) else 0


def _stop_on_signals(stop: Callable[[], None]) -> None:
    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
