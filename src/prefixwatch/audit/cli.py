"""`prefixwatch audit`: which token breaks the prefix cache, and what a fix would achieve.

The audit of a pre-tokenized log imports only what it runs: the progress bar (tqdm) when it
is shown, an HTTP client only with ``--server``. ``python -m prefixwatch.audit.cli LOG`` runs
the audit alone, without the other commands' parsers (``benchmarks/bench_audit_e2e.py``
compares both with the naive loop).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from prefixwatch.audit.analysis import Auditor, Report, diff
from prefixwatch.core.cache.requestledger import COUNTED as LEDGER_COUNTED
from prefixwatch.core.cache.requestledger import Parts
from prefixwatch.core.cache.requestledger import table as ledger_table
from prefixwatch.core.cache.whatvaries import FIXES, OWN_CONTENT
from prefixwatch.core.errors import ConfigError, PrefixwatchError
from prefixwatch.core.kv.poolcurve import PoolCurve, verdict
from prefixwatch.core.logs.formats import BadLine, LogRequest, read_jsonl
from prefixwatch.core.logs.tokenizers import (
    AuditError,
    NoTokenizer,
    ServerTokenizer,
    Tokenizer,
    open_tokenizer,
)
from prefixwatch.core.story import NOT_CULPRITS, Culprit, percent

log = logging.getLogger("prefixwatch.audit")
BATCH = 64


def add_audit_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "audit", help="find where prompts stop sharing a prefix in a request log",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Replay a JSONL request log (OpenAI chat, completion or pre-tokenized "
                    "lines, oldest first) through vLLM's prefix-caching rule (or SGLang's, "
                    "--engine sglang): the hit rate an "
                    "unlimited cache could reach, where requests stop matching, what varies "
                    "there and how to fix it.\n\n"
                    "  prefixwatch audit requests.jsonl --server http://localhost:8000\n"
                    "  prefixwatch audit diff first.json second.json --tokenizer ./tok\n",
        epilog="Exit status: 0 ok, 1 achievable hit rate under --fail-under, 2 bad input.")
    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="JSONL log files ('-' for stdin); or `diff A.json B.json`")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--server", metavar="URL",
                     help="tokenize with vLLM's POST /tokenize at URL (chat template included)")
    how.add_argument("--tokenizer", metavar="DIR",
                     help="a local Hugging Face tokenizer directory (offline), or 'builtin' "
                          "for the simulator's tokenizer")
    p.add_argument("--engine", choices=["vllm", "sglang"], default="vllm",
                   help="whose caching rule to replay: vllm (whole blocks) or sglang (its "
                        "radix cache: pages of --page-size tokens) (default vllm)")
    p.add_argument("--block-size", type=int, metavar="N",
                   help="tokens per KV block (default: the server's, else 16)")
    p.add_argument("--page-size", type=int, metavar="N",
                   help="with --engine sglang: SGLang's --page-size (default 1: token by "
                        "token)")
    p.add_argument("--kv-blocks", type=int, metavar="N",
                   help="also replay through an LRU pool of N blocks (eviction; with "
                        "--engine sglang, N pages), and through pools 1.25, 1.5, 2 and 4 "
                        "times larger (the pool curve: how much memory would win it back)")
    p.add_argument("--no-pool-curve", action="store_true",
                   help="with --kv-blocks, replay at N blocks only (one replay, not five)")
    p.add_argument("--format", choices=["text", "json"], default="text",
                   help="a readable report (default) or JSON for CI")
    p.add_argument("--top", type=int, default=10, metavar="N", help="divergence positions to show")
    p.add_argument("--redact", action="store_true",
                   help="hide the decoded context (logs hold user data)")
    p.add_argument("--fail-under", type=float, metavar="RATE",
                   help="exit 1 when the achievable hit rate is below RATE (0-1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _tokenizer(args: argparse.Namespace) -> Tokenizer:
    return open_tokenizer(args.server, args.tokenizer)


def _batches(items: Iterable[LogRequest | BadLine], size: int
             ) -> Iterator[list[LogRequest | BadLine]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


def run_audit(args: argparse.Namespace) -> int:
    try:
        if args.logs[0] == "diff":
            return _run_diff(args)
        return _run_log(args)
    except AuditError as exc:
        raise ConfigError(str(exc)) from exc


def _require_pretokenized(batch: list[LogRequest]) -> None:
    """Without --server or --tokenizer only token ids can be audited: a text line is one
    clear error (exit 2), not a warning per line and an empty report."""
    for req in batch:
        if req.token_ids is None:
            raise ConfigError(
                f"{req.where} is a text request (chat or completion), which needs a tokenizer: "
                "give --server URL (vLLM's /tokenize), --tokenizer DIR (a Hugging Face "
                "tokenizer) or --tokenizer builtin (the simulator's); pre-tokenized lines "
                "(prompt_token_ids) need none")


def _block_size(args: argparse.Namespace, tok: Tokenizer) -> int:
    if getattr(args, "engine", "vllm") == "sglang":
        if args.block_size is not None:
            raise ConfigError("--engine sglang matches by pages: give --page-size, not "
                              "--block-size")
        page = 1 if args.page_size is None else args.page_size
        if page < 1:
            raise ConfigError("--page-size must be at least 1")
        return page
    if getattr(args, "page_size", None) is not None:
        raise ConfigError("--page-size is SGLang's: give it with --engine sglang")
    if args.block_size is not None:
        if args.block_size < 1:
            raise ConfigError("--block-size must be at least 1")
        return args.block_size
    if isinstance(tok, ServerTokenizer):
        found = tok.block_size()
        if found:
            log.info("block size %d, from the server's vllm:cache_config_info", found)
            return found
    return 16


_WARN_LINES = 10  # lines named one by one; the rest are counted


def _skipped(report: Report, where: str, why: str) -> None:
    """Count a skipped line; they are named at the end (a garbage file is one message)."""
    report.bad_lines.append((where, why))


def _run_log(args: argparse.Namespace) -> int:
    if args.fail_under is not None and not 0 <= args.fail_under <= 1:
        raise ConfigError("--fail-under takes a rate between 0 and 1")
    if args.kv_blocks is not None and args.kv_blocks < 2:
        raise ConfigError("--kv-blocks must be at least 2")
    for path in args.logs:
        if path != "-":
            try:
                open(path, "rb").close()
            except OSError as exc:
                raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    tok = _tokenizer(args)
    text_capable = not isinstance(tok, NoTokenizer)
    auditor = Auditor(_block_size(args, tok), args.kv_blocks, args.engine,
                      not args.no_pool_curve)
    report = auditor.report
    bar = _progress(args.no_progress)
    for batch in _batches(read_jsonl(args.logs), BATCH):
        good = [r for r in batch if isinstance(r, LogRequest)]
        if not text_capable:
            _require_pretokenized(good)
        tokenized = iter(tok.tokenize(good))
        for item in batch:
            if isinstance(item, BadLine):
                _skipped(report, item.where, item.reason)
                continue
            ids = next(tokenized)
            if isinstance(ids, str):
                _skipped(report, item.where, ids)
                continue
            try:
                auditor.add(ids, item.extra_keys, item.replica, item.cached_tokens,
                            item.max_tokens)
            except ValueError as exc:  # a tokenizer's id beyond 32 bits
                _skipped(report, item.where, str(exc))
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    if report.bad_lines and not report.requests:
        where, why = report.bad_lines[0]
        raise ConfigError(f"no request could be read: {len(report.bad_lines)} line(s) "
                          f"skipped (first, {where}: {why})")
    if not report.requests:
        raise ConfigError(f"no request in {', '.join(args.logs)}: the log is empty (a JSONL "
                          "request log has one request a line)")
    for where, why in report.bad_lines[:_WARN_LINES]:
        log.warning("%s: skipped: %s", where, why)
    if len(report.bad_lines) > _WARN_LINES:
        log.warning("%d more lines skipped", len(report.bad_lines) - _WARN_LINES)
    top = report.top_divergences(tok.decode, max(args.top, GROUPED), args.redact,
                                 decoded=text_capable)
    said = answer(report, top, auditor)
    top = top[:args.top]
    if args.format == "json":
        print(json.dumps({"headline": said, **_as_json(report, top),
                          "ledger": _ledger_json(auditor)}, indent=2))
    else:
        print(said + "\n")
        print(_as_text(report, top))
        print("\nThe ledger: where every prompt token went (docs/runbooks.md#the-hit-rate-ledger)")
        totals = auditor.ledger.totals
        print("\n".join(ledger_table(totals, totals.achieved, auditor.ledger.unmeasured())))
        curve = report.pool_curve()
        if curve is not None:
            print("\n" + "\n".join(_curve_text(curve, totals, args.kv_blocks)))
    rate = report.achievable_hit_rate
    if args.fail_under is not None and (rate is None or rate < args.fail_under):
        return 1
    return 0


#: Divergence positions read to find the culprit and group the rows (the table shows --top).
GROUPED = 64


def culprit(report: Report, top: list[dict]) -> Culprit | None:
    """The kind behind most early divergences, from the token where its value starts to the
    last where requests part over it (the rows of ``top``), with its share of the requests
    (core/story.py words it)."""
    kinds: dict[str, list[dict]] = {}
    for row in top:
        if row["kind"] not in NOT_CULPRITS:
            kinds.setdefault(row["kind"], []).append(row)
    if not kinds or not report.requests:
        return None
    kind, rows = max(kinds.items(), key=lambda kv: sum(r["count"] for r in kv[1]))
    return Culprit(kind, min(r["starts_at"] for r in rows),
                   sum(r["count"] for r in rows) / report.requests,
                   max(r["position"] for r in rows))


def answer(report: Report, top: list[dict], auditor: Auditor) -> str:
    """The audit's answer in one line: the culprit, the prompt tokens a fix would serve, the
    fix; or that the prompts share their prefix up to each request's own content."""
    found = culprit(report, top)
    if found is None:
        return (f"No culprit: the requests share their prefix up to their own content; an "
                f"unlimited cache serves {percent(report.achievable_hit_rate)} of the prompt "
                "tokens.")
    totals = auditor.ledger.totals
    layout = totals.layout / totals.prompt if totals.prompt and (
        "layout" not in auditor.ledger.unmeasured()) else None
    lost = (f"{percent(layout)} of prompt tokens a layout fix would serve"
            if layout else f"an unlimited cache serves only "
                           f"{percent(report.achievable_hit_rate)} of prompt tokens")
    return f"Culprit: {found.words}: {lost}. Fix: {FIXES.get(found.kind, '')}"


def _progress(off: bool) -> Any:
    """A progress bar on a terminal (tqdm, imported only then), else None."""
    if off or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(unit=" req", desc="auditing", file=sys.stderr)


def _ledger_json(auditor: Auditor) -> dict[str, Any]:
    totals = auditor.ledger.totals
    out: dict[str, Any] = {part: getattr(totals, part) for part in LEDGER_COUNTED}
    out["achieved"] = totals.achieved
    out["unexplained"] = (None if totals.achieved is None
                          else totals.pool_reach - totals.achieved)
    out["unmeasured"] = list(auditor.ledger.unmeasured())
    return out


def _as_json(report: Report, top: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "requests": report.requests, "prompt_tokens": report.prompt_tokens,
        "cacheable_tokens": report.cacheable_tokens,
        "achievable_hit_rate": report.achievable_hit_rate,
        "block_size": report.block_size, "engine": report.engine, "divergence": top,
        "skipped_lines": len(report.bad_lines),
    }
    if report.engine == "sglang":
        out["page_size"] = report.block_size
    if report.kv_blocks is not None:
        out["kv_blocks"] = report.kv_blocks
        out["simulated_hit_rate"] = report.simulated_hit_rate
    curve = report.pool_curve()
    if curve is not None:
        out["pool_curve"] = {"1": curve.today, **curve.whatif}
    return out


def _curve_text(curve: PoolCurve, totals: Parts, kv_blocks: int) -> list[str]:
    """The pool curve as text rows, and the sentence that reads it (the ledger names the
    missed tokens when memory would not help)."""
    parts = {"layout": totals.layout, "novel": totals.novel, "routing": totals.routing}
    rows = ["The pool curve: the same log through larger KV pools (docs/capacity.md)",
            f"{'POOL':>6} {'BLOCKS':>8} {'HIT RATE':>9}"]
    for multiple, rate in curve.points():
        rows.append(f"{multiple:>5g}x {round(kv_blocks * multiple):>8} {rate:>9.1%}")
    return [*rows, verdict(curve, parts)]


def _pct(value: float | None) -> str:
    return percent(value)


def _as_text(report: Report, top: list[dict]) -> str:
    unit = ("block size", "blocks") if report.engine == "vllm" else (
        "SGLang's rule, page size", "pages")
    lines = [
        f"requests            {report.requests}",
        f"prompt tokens       {report.prompt_tokens}",
        f"cacheable tokens    {report.cacheable_tokens}   (unlimited cache, {unit[0]} "
        f"{report.block_size})",
        f"achievable hit rate {_pct(report.achievable_hit_rate)}",
    ]
    if report.kv_blocks is not None:
        lines.append(f"simulated hit rate  {_pct(report.simulated_hit_rate)}   "
                     f"(LRU pool of {report.kv_blocks} {unit[1]})")
    if report.bad_lines:
        lines.append(f"skipped lines       {len(report.bad_lines)} (first: "
                     f"{report.bad_lines[0][0]}: {report.bad_lines[0][1]})")
    if top:
        lines += ["", "Where requests stop matching earlier ones, by what varies there "
                      "(most requests first):"]
        for kind, rows in _grouped(top):
            lines += ["", f"{kind} ({sum(r['count'] for r in rows)} requests): "
                          f"{rows[0]['fix']}"]
            if kind == OWN_CONTENT:
                positions = sorted(r["position"] for r in rows)
                lines.append(f"  {len(rows)} positions from token {positions[0]} to "
                             f"{positions[-1]}, summed")
                continue
            lines.append(f"  {'POSITION':>8}  {'REQUESTS':>8}  CONTEXT")
            for row in rows:
                context = row["context"].replace("\n", "\\n")
                lines.append(f"  {row['position']:>8}  {row['count']:>8}  {context[:150]}")
    return "\n".join(lines)


def _grouped(top: list[dict]) -> list[tuple[str, list[dict]]]:
    """The rows by kind, the kinds by their requests (own content, nothing to fix, last)."""
    kinds: dict[str, list[dict]] = {}
    for row in top:
        kinds.setdefault(row["kind"], []).append(row)
    return sorted(kinds.items(), key=lambda kv: (kv[0] == OWN_CONTENT,
                                                 -sum(r["count"] for r in kv[1]), kv[0]))


def _run_diff(args: argparse.Namespace) -> int:
    if len(args.logs) != 3:
        raise ConfigError("usage: prefixwatch audit diff A.json B.json")
    from prefixwatch.core.logs.strictline import parse_request

    tok = _tokenizer(args)
    requests_: list[LogRequest] = []
    for path in args.logs[1:]:
        try:
            with open(path, encoding="utf-8") as fh:
                requests_.append(parse_request(json.load(fh), path))
        except OSError as exc:
            raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
        except RecursionError:
            raise ConfigError(f"{path}: not JSON (nested too deeply)") from None
        except ValueError as exc:
            raise ConfigError(f"{path}: {exc}") from exc
    ids = tok.tokenize(requests_)
    for path, item in zip(args.logs[1:], ids, strict=True):
        if isinstance(item, str):
            raise ConfigError(f"{path}: {item}")
    a, b = (list(x) for x in ids)  # type: ignore[arg-type]
    bs = _block_size(args, tok)
    result = diff(a, b, bs)  # type: ignore[arg-type]
    pos = result["first_divergent_token"]
    if args.format == "json":
        if args.redact:
            result["context"] = "[redacted]"
        elif pos is not None:
            result["context"] = {"a": tok.decode(a[max(0, pos - 12):pos + 12]),  # type: ignore
                                 "b": tok.decode(b[max(0, pos - 12):pos + 12])}  # type: ignore
        print(json.dumps(result, indent=2))
        return 0
    if pos is None:
        print("the two prompts are identical")
    else:
        print(f"first divergent token: {pos}")
        if not args.redact:
            print(f"  A: {tok.decode(a[max(0, pos - 12):pos])!r} ⟦"  # type: ignore[index]
                  f"{tok.decode(a[pos:pos + 12])!r}⟧")  # type: ignore[index]
            print(f"  B: {tok.decode(b[max(0, pos - 12):pos])!r} ⟦"  # type: ignore[index]
                  f"{tok.decode(b[pos:pos + 12])!r}⟧")  # type: ignore[index]
    unit = "pages" if args.engine == "sglang" else "blocks"
    print(f"reusable {unit}: {result['reusable_blocks']} of {result['blocks']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The audit on its own (``python -m prefixwatch.audit.cli``): the same flags, output,
    messages and exit status as ``prefixwatch audit``."""
    parser = argparse.ArgumentParser(prog="prefixwatch")
    add_audit_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["audit", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run_audit(args)
    except PrefixwatchError as exc:
        print(f"prefixwatch audit: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
