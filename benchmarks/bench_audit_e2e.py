"""`prefixwatch audit` end to end, as a whole process, against the naive loop on the same log.

The log: 4,000 pre-tokenized requests of about 2,500 tokens (JSONL lines with
``prompt_token_ids``; bench_audit.workload's chat-like prompts with a longer user turn), written
once before any timing. Each side is a process of its own, started the same way and timed from
the start to the exit, so interpreter start, imports, reading and decoding the log count on
both sides:

- the naive loop (the baseline): ``json.loads`` of each line into the list of prompts that the
  seed's loop takes, then bench_audit.naive (chained tuple hashes per block, a set of seen
  hashes, a token-by-token first divergence); it imports only the standard library. Also
  shown: the same loop fed one line at a time (no prompt kept: less memory, less time);
- ``prefixwatch audit LOG --format json --no-progress``, the console script;
- ``python -m prefixwatch.audit.cli LOG ...``, the audit without the other sub-commands'
  parsers (what the audit itself costs, whatever the `prefixwatch` wiring imports).

Every side and every run must find the same cacheable and prompt tokens (checked, or the
benchmark fails). Runs are interleaved (naive, streaming, audit, direct, then again) and the
best of each is compared, since a shared machine only ever adds time; the CPU seconds (user +
system) of the same best runs are printed too, as they move less with the machine's load.
Target: 3x (4x and more on a quiet machine).

What is cached between runs, for both sides alike: the log in the OS page cache, and compiled
bytecode. An installed package's modules are compiled once (pip compiles them at install, an
editable install on first import), never on each run; so every side first runs once untimed
with a private bytecode cache (``PYTHONPYCACHEPREFIX`` in the temporary directory, also where
``PYTHONDONTWRITEBYTECODE`` is set), and the timed runs read it. ``--compile-each-run`` times
compiling from source in every process instead. Nothing else outlives a process: no result,
no decoded line, no parser.

Run: python benchmarks/bench_audit_e2e.py [--requests 4000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def write_log(path: Path, n: int, seed: int = 5) -> None:
    """``n`` requests of 2,500 tokens: bench_audit.workload's 2,000-token system prompts
    (a third with a timestamp near the top) and a 500-token user turn."""
    sys.path.insert(0, str(HERE))
    from bench_audit import workload

    rng = random.Random(seed + 1)
    with path.open("w") as fh:
        for prompt in workload(n, seed):
            prompt += [rng.randrange(256, 128000) for _ in range(100)]
            fh.write(json.dumps({"prompt_token_ids": prompt}) + "\n")


def naive_main(path: str, stream: bool) -> None:
    """The naive side, in its own process: the standard library and bench_audit.naive only;
    the log loaded into a list of prompts first (as the seed's loop takes them), or
    ``stream``: one line at a time, no prompt kept."""
    sys.path.insert(0, str(HERE))
    from bench_audit import naive

    with open(path) as fh:
        prompts = (json.loads(line)["prompt_token_ids"] for line in fh)
        cacheable, total = naive(prompts if stream else list(prompts))
    print(json.dumps({"cacheable_tokens": cacheable, "prompt_tokens": total}))


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, dict]:
    """Wall seconds, CPU seconds (user + system, the process and its children) and the
    answer of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return elapsed, cpu, json.loads(done.stdout)


def import_seconds(module: str, repeat: int, env: dict[str, str] | None = None) -> float:
    """Best time of a process that only imports ``module``, less an empty interpreter's."""
    def once(code: str) -> float:
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        return time.perf_counter() - start
    empty = min(once("pass") for _ in range(repeat))
    once(f"import {module}")  # fills the bytecode cache, when there is one
    return min(once(f"import {module}") for _ in range(repeat)) - empty


def child_env(tmp: str, cache: bool) -> dict[str, str]:
    """The sides' environment: with ``cache``, a private bytecode cache under ``tmp``."""
    env = dict(os.environ)
    if cache:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
    return env


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--naive", metavar="LOG", help=argparse.SUPPRESS)  # the naive process
    p.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-direct", action="store_true",
                   help="time only the console script (an older prefixwatch, through "
                        "PYTHONPATH, has no python -m prefixwatch.audit.cli)")
    p.add_argument("--compile-each-run", action="store_true",
                   help="no bytecode cache: every process compiles its modules from source")
    args = p.parse_args()
    if args.naive:
        naive_main(args.naive, args.stream)
        return
    script = shutil.which("prefixwatch", path=os.path.dirname(sys.executable)) or shutil.which(
        "prefixwatch")
    if script is None:
        raise SystemExit("no `prefixwatch` console script: pip install -e . first")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "requests.jsonl"
        write_log(log, args.requests)
        flags = [str(log), "--format", "json", "--no-progress"]
        sides = {
            "naive": [sys.executable, __file__, "--naive", str(log)],
            "streaming": [sys.executable, __file__, "--naive", str(log), "--stream"],
            "audit": [script, "audit", *flags],
            "direct": [sys.executable, "-m", "prefixwatch.audit.cli", *flags],
        }
        if args.no_direct:
            del sides["direct"]
        env = child_env(tmp, cache=not args.compile_each_run)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
        answers: dict[str, set[tuple[int, int]]] = {name: set() for name in sides}
        if not args.compile_each_run:
            for cmd in sides.values():
                timed(cmd, env)  # untimed: compiles each side's modules into the cache
        for _ in range(args.repeat):
            for name, cmd in sides.items():
                elapsed, cpu, out = timed(cmd, env)
                times[name].append((elapsed, cpu))
                answers[name].add((out["cacheable_tokens"], out["prompt_tokens"]))
        size = log.stat().st_size
        imports = {module: import_seconds(module, args.repeat, env)
                   for module in ("prefixwatch.cli", "prefixwatch.audit.cli")}
    found = set().union(*answers.values())
    if len(found) != 1:  # every side and every run: the same tokens, or no figure at all
        raise SystemExit(f"the sides disagree (cacheable, prompt tokens): {answers}")
    cacheable, tokens = found.pop()
    best_runs = {name: min(ts) for name, ts in times.items()}
    best = {name: run[0] for name, run in best_runs.items()}
    cpu = {name: run[1] for name, run in best_runs.items()}
    print(f"{args.requests} requests, {tokens:,} tokens, {size / 1e6:.0f} MB of JSONL, "
          f"best of {args.repeat} runs each, whole processes, "
          f"{'compiling from source each run' if args.compile_each_run else 'bytecode cached'}")
    print(f"achievable hit rate: {cacheable / tokens:.3f} (all agree)")
    print(f"naive loop (json.loads + tuple hashes): {best['naive']:6.2f} s  (the baseline)")
    print(f"  the same, one line at a time:         {best['streaming']:6.2f} s")
    for name, label, note in (("audit", "prefixwatch audit", "target 3x"),
                              ("direct", "python -m prefixwatch.audit.cli",
                               "the audit without the other commands")):
        if name not in best:
            continue
        print(f"{label + ':':40s}{best[name]:6.2f} s  {best['naive'] / best[name]:4.1f}x "
              f"({note}; {best['streaming'] / best[name]:.1f}x the streaming loop)")
    print("CPU seconds of those runs: " + ", ".join(
        f"{name} {cpu[name]:.2f}" for name in best) + f" ({cpu['naive'] / cpu['audit']:.1f}x)")
    print(f"imports: prefixwatch.cli {imports['prefixwatch.cli']:.2f} s, "
          f"prefixwatch.audit.cli {imports['prefixwatch.audit.cli']:.2f} s")


if __name__ == "__main__":
    main()
