"""`prefixwatch report`'s flags and run; cli.py passes in what pages (from the mixin config)."""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from prefixwatch.core import cliargs
from prefixwatch.core.errors import ConfigError
from prefixwatch.report import Request, write_report


def add_report_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "report", help="write an incident report (HTML, Markdown, figures) from Prometheus",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Query Prometheus over a time range and write report.html (one file, "
                    "opens offline), report.md (a postmortem skeleton: timeline, hit rate "
                    "before/during/after, TTFT, recomputed tokens, diagnosis) and the figures "
                    "as PNG and SVG.\n\n"
                    "  prefixwatch report --prometheus http://127.0.0.1:9090 --since 2h\n"
                    "  prefixwatch report --prometheus URL --from 2026-01-05T10:00:00Z "
                    "--to 2026-01-05T12:00:00Z --out incident-42\n",
        epilog="Exit status: 0 written, 2 Prometheus unreachable, no prefixwatch series in "
               "range, unknown model or bad flag.")
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus base URL, e.g. http://127.0.0.1:9090")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--since", metavar="DURATION", type=cliargs.duration,
                      help="the last DURATION, e.g. 2h or 7200 (seconds)")
    when.add_argument("--from", dest="start", metavar="TIME",
                      help="range start: RFC 3339 (2026-01-05T10:00:00Z) or unix seconds")
    p.add_argument("--to", dest="end", metavar="TIME", help="range end (default: now)")
    p.add_argument("--model", metavar="NAME",
                   help="model_name to report on (default: the busiest in range)")
    p.add_argument("--config", metavar="FILE",
                   help="the mixin's rules config (every key: `prefixwatch example-config "
                        "mixin`): the report reads the ratio, window and threshold that page "
                        "under it")
    p.add_argument("--threshold", type=float, metavar="RATIO",
                   help="alert threshold (0-1; default: the config's, else the default)")
    p.add_argument("--requests-log", metavar="PATH",
                   help="a request log (JSONL or vLLM's): add the first divergent token, "
                        "decoded, and its fix")
    p.add_argument("--tokenizer", metavar="SPEC",
                   help="decode the request log with 'builtin', a Hugging Face tokenizer "
                        "directory or a vLLM URL (/tokenize); default: token ids only")
    p.add_argument("--block-size", type=int, default=16, metavar="N",
                   help="KV block size for the request log (default 16)")
    p.add_argument("--prefill-tokens-per-second", type=float, metavar="N",
                   help="prefill throughput of one GPU: recomputed tokens as GPU-seconds")
    p.add_argument("--price-per-million-tokens", type=float, metavar="PRICE",
                   help="cost of a million prefill tokens: recomputed tokens as money")
    p.add_argument("--timeout", type=cliargs.duration, default=60.0, metavar="DURATION",
                   help="deadline of all the report's queries to Prometheus together "
                        "(default 60s)")
    p.add_argument("--out", default="prefixwatch-report", metavar="DIR",
                   help="output directory (default ./prefixwatch-report)")
    return p


def parse_time(text: str) -> float:
    """RFC 3339 or unix seconds -> unix seconds; ConfigError otherwise."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(f"not a time: {text!r} (use 2026-01-05T10:00:00Z or unix "
                          "seconds)") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def time_range(args: argparse.Namespace, now: float | None = None) -> tuple[float, float]:
    now = time.time() if now is None else now
    end = parse_time(args.end) if args.end else now
    if args.since:
        return end - args.since, end
    return parse_time(args.start), end


@dataclass(frozen=True)
class Paging:
    """What pages: the threshold, the ratio it judges, the recorded window the critical alert
    reads and the rules' time scale."""

    threshold: float
    hit_ratio: str
    window: str
    time_scale: float


def report_on_paging(args: argparse.Namespace, paging: Paging) -> int:
    """Write the report on the series that page."""
    start, end = time_range(args)
    if end <= start:
        raise ConfigError("--from must be before --to")
    for flag in ("prefill_tokens_per_second", "price_per_million_tokens", "timeout"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be greater than 0")
    if args.block_size < 1:
        raise ConfigError("--block-size must be at least 1")
    request = Request(start, end, paging.threshold, args.model, paging.window, paging.time_scale,
                      paging.hit_ratio, args.prefill_tokens_per_second,
                      args.price_per_million_tokens)
    written = write_report(args.prometheus, args.out, request, args.requests_log,
                           args.block_size, args.tokenizer, args.timeout)
    print(f"wrote {written.html} and {written.markdown} ({len(written.figures)} figure files) "
          f"on {written.data.model}")
    return 0
