"""Shared test helpers: a loopback HTTP server whose answer each test controls.

The suite runs in parallel (pytest-xdist, ``-n auto --dist loadgroup`` in pyproject.toml's
addopts), so every test must be safe beside any other in another process:

- temporary files under ``tmp_path`` only; servers on 127.0.0.1 with port 0, the port read
  from what the server reports (``start_listening``, ``start_prometheus``); ``free_port()``
  only where a port must be given twice (a demo restarted on the same ports), with a retry
  when another process takes it first; ``refused_port()`` for an unreachable address;
- anything cached across tests or runs (the npm packages under ~/.cache/prefixwatch) is
  built under a file lock (``npm_packages``);
- tests that share an expensive module fixture carry one ``xdist_group`` mark
  (``pytestmark = pytest.mark.xdist_group("name")``) so the fixture is built once, in one
  worker; slow end-to-end tests (real Prometheus, Alertmanager, Docker) are marked
  ``integration`` and may take any group of their own, e.g. ``xdist_group("compose")`` for a
  Docker Compose test, so they never wait behind each other.

Most end-to-end tests wait on compressed wall-clock time rather than the CPU, and promtool
(the one long CPU load) runs at a lower priority, so ``-n auto`` starts three workers per core
(``pytest_xdist_auto_num_workers`` below);
``PYTEST_XDIST_AUTO_NUM_WORKERS=N`` or ``-n N`` chooses another number, ``-n 0`` none.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests
import yaml

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: three workers per core, as the end-to-end tests mostly wait (on compressed
    wall-clock windows) and promtool, the one long CPU load, runs at a lower priority."""
    return 3 * (os.cpu_count() or 1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` first (in their order), so the parallel run never ends waiting
    on one long test that started last."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def vllm_page() -> str:
    """The real vLLM 0.33 /metrics body (copied from shared/fixtures)."""
    return (FIXTURES / "vllm_metrics.txt").read_text()


@dataclass
class Answer:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    delay: float = 0.0
    chunked_truncate: bool = False


class PageServer:
    """Serves whatever ``answer`` says on 127.0.0.1, on a free port."""

    def __init__(self) -> None:
        self.answer = Answer()
        self.hits = 0
        self.headers: list[dict[str, str]] = []
        #: (start, end) of every request served, on the monotonic clock.
        self.spans: list[tuple[float, float]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                started = time.monotonic()
                try:
                    self._answer()
                finally:
                    server.spans.append((started, time.monotonic()))

            def _answer(self) -> None:
                server.hits += 1
                server.headers.append(dict(self.headers))
                answer = server.answer
                if answer.delay:
                    time.sleep(answer.delay)
                try:
                    self.send_response(answer.status)
                    self.send_header("Content-Type", answer.content_type)
                    if answer.chunked_truncate:
                        self.send_header("Content-Length", str(len(answer.body) + 1000))
                    else:
                        self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def serve(self, body: str | bytes, **kwargs: object) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.answer = Answer(body=data, **kwargs)  # type: ignore[arg-type]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def page_server() -> Iterator[PageServer]:
    server = PageServer()
    yield server
    server.close()


def free_port() -> int:
    """A port that was free a moment ago: only for a server that must be told its port
    before it starts (a second process may take it first); prefer port 0 and
    ``start_listening``."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def refused_port() -> Iterator[int]:
    """A port where a connection is refused for as long as the block runs: bound and never
    listening, so no other server can take it meanwhile (a port merely found free can be
    taken by any server on port 0 before the test connects)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


_LISTENING = re.compile(r'msg="Listening on" address=\S*:(\d+)')


@dataclass
class Listening:
    """A started Prometheus or Alertmanager, the port it bound and its log so far."""

    proc: subprocess.Popen
    port: int
    log: list[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def start_listening(cmd: list[str], timeout: float = 30,
                    listening: re.Pattern[str] | None = None) -> Listening:
    """Start a server told to bind port 0 (a Prometheus-family binary given
    ``--web.listen-address=127.0.0.1:0``; or prefixwatch's own, with ``listening`` matching
    its log line): the port it bound, read from its own log (no bind-and-close race between
    parallel tests). Its log keeps being read (into ``log``), so the pipe never fills."""
    listening = listening or _LISTENING
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    found: list[int] = []
    seen = threading.Event()

    def pump() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            match = listening.search(line)
            if match and not found:
                found.append(int(match.group(1)))
                seen.set()
        seen.set()  # the process ended

    threading.Thread(target=pump, daemon=True).start()
    if not seen.wait(timeout) or not found:
        proc.kill()
        raise AssertionError(f"{cmd[0]} did not start listening: {''.join(lines)[-2000:]}")
    return Listening(proc, found[0], lines)


_RELOADED = 'msg="Completed loading of configuration file"'


def start_prometheus(binary: str, config_path: Path, config: Callable[[str], dict],
                     *args: str, self_job: str = "prometheus") -> Listening:
    """A Prometheus on ``127.0.0.1:0`` whose config names its own address (the stack's
    self-scrape job ``self_job``): ``config(address)`` gives the config for an address.

    It starts without the self-scrape job, its port is read from its log, then the whole
    config (the job pointed at that port) is written and loaded with SIGHUP; this returns
    once its log says that load completed. No port is handed over from a closed socket.
    """
    def without_self(cfg: dict) -> dict:
        jobs = [j for j in cfg.get("scrape_configs", []) if j.get("job_name") != self_job]
        return {**cfg, "scrape_configs": jobs}

    config_path.write_text(yaml.safe_dump(without_self(config("127.0.0.1:0"))))
    started = start_listening([binary, f"--config.file={config_path}",
                               "--web.listen-address=127.0.0.1:0", *args])
    config_path.write_text(yaml.safe_dump(config(f"127.0.0.1:{started.port}")))
    # Prometheus holds a SIGHUP until its first load is done, then loads again: two loads.
    started.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while sum(_RELOADED in line for line in list(started.log)) < 2:
        if started.proc.poll() is not None or time.monotonic() > deadline:
            started.proc.kill()
            raise AssertionError(f"{binary} did not reload its config: "
                                 f"{''.join(started.log)[-2000:]}")
        time.sleep(0.05)
    return started


def with_counters(page: str, queries: float, hits: float) -> str:
    """The fixture page with other prefix-cache counter values (a later poll); the device's
    cached-by-source count follows the hits, as on a real vLLM page."""
    out = []
    for line in page.splitlines():
        if line.startswith("vllm:prefix_cache_queries_total{"):
            line = line.rsplit(" ", 1)[0] + f" {queries}"
        elif line.startswith(("vllm:prefix_cache_hits_total{", "vllm:prompt_tokens_cached_total{")
                             ) or (line.startswith("vllm:prompt_tokens_cached_by_source_total{")
                                   and 'source="device"' in line):
            line = line.rsplit(" ", 1)[0] + f" {hits}"
        out.append(line)
    return "\n".join(out) + "\n"


def require_binary(name: str, package: str) -> str:
    """The path of a real tool the test needs. CI (PREFIXWATCH_REQUIRE_BINARIES=1) fails when
    it is missing; elsewhere the test is skipped with a loud reason saying how to install it."""
    import os
    import shutil
    import warnings

    path = shutil.which(name)
    if path:
        return path
    message = f"{name} is not installed: run `apt-get install {package}` (Debian)"
    if os.environ.get("PREFIXWATCH_REQUIRE_BINARIES") == "1":
        pytest.fail(message)
    warnings.warn(message, stacklevel=2)
    pytest.skip(message)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if needed): one process at a time, across
    xdist workers and concurrent test runs; released when the process dies."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cache_dir() -> Path:
    """Where tests keep what outlives a run (``$PREFIXWATCH_CACHE``, else
    ~/.cache/prefixwatch)."""
    import os

    return Path(os.environ.get("PREFIXWATCH_CACHE", Path.home() / ".cache" / "prefixwatch"))


#: A whole generated promtool suite takes about a minute of CPU: on a loaded two-core machine
#: with other suites beside it, several.
PROMTOOL_TIMEOUT = 900


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real promtool (``check``, ``test rules``), its output captured. Its garbage
    collector is tuned for short runs (``GOGC=800`` unless set): a generated suite allocates
    a parsed query per rule and step, and collects a third less often for 200 MB. One
    thread runs Go code (``GOMAXPROCS=1`` unless set: it evaluates one step at a time, and a
    second would only run the collector's idle workers beside the other tests), at a lower
    priority (``_lower_priority``)."""
    promtool = require_binary("promtool", "prometheus")
    env = {"GOGC": "800", "GOMAXPROCS": "1", **os.environ}
    return subprocess.run([promtool, *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=PROMTOOL_TIMEOUT, preexec_fn=_lower_priority)


def _lower_priority() -> None:
    """promtool is pure CPU work with no clock to keep: at a lower priority (nice 10) it
    takes the cores only when the end-to-end tests beside it, whose compressed windows run on
    the wall clock, leave them idle."""
    os.nice(10)


def _promql_seconds(text: str) -> int:
    """``62m30s`` -> 3750 (the durations of promtool test files)."""
    unit = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return int(sum(int(n) * unit[u] for n, u in re.findall(r"(\d+)(ms|[smhdw])", text)))


def virtual_time(case: dict) -> int:
    """The virtual seconds promtool evaluates a test case for: up to its last check."""
    evals = case.get("alert_rule_test", []) + case.get("promql_expr_test", [])
    return max((_promql_seconds(e["eval_time"]) for e in evals), default=0)


def split_cases(cases: list[dict], chunks: int) -> list[list[dict]]:
    """promtool test cases in ``chunks`` parts of about equal virtual time (the longest case
    first into the lightest part); each case in exactly one part."""
    parts: list[list[dict]] = [[] for _ in range(chunks)]
    loads = [0] * chunks
    for case in sorted(cases, key=virtual_time, reverse=True):
        lightest = loads.index(min(loads))
        parts[lightest].append(case)
        loads[lightest] += virtual_time(case) or 1
    return parts


def promtool_test_chunk(test_file: Path, chunk: int, chunks: int, tmp: Path
                        ) -> subprocess.CompletedProcess:
    """``promtool test rules`` on one of ``chunks`` parts of a test file's cases (parts of
    about equal virtual time, its longest cases spread first), so the parts of a long suite
    run on parallel workers. Every case runs in exactly one part, each with the rules it
    asserts and what they read (``tests/promtoolcases.py``), in one promtool process."""
    from tests.promtoolcases import RuleGraph, write_case_files

    doc = yaml.safe_load(test_file.read_text())
    rule_files = [(test_file.parent / f).resolve() for f in doc["rule_files"]]
    cases = split_cases(doc["tests"], chunks)[chunk]
    paths = write_case_files(doc, cases, RuleGraph(rule_files), tmp,
                             f"{test_file.stem}.part{chunk}")
    return run_promtool("test", "rules", *map(str, paths))


def npm_packages(name: str, packages: tuple[str, ...]) -> Path:
    """A directory with these npm packages installed (cached under ~/.cache/prefixwatch),
    installed by one process while the others wait on its lock."""
    npm = require_binary("npm", "npm")
    require_binary("node", "nodejs")
    workdir = cache_dir() / name
    marker = workdir / ".installed"
    with file_lock(cache_dir() / f"{name}.lock"):
        if not marker.exists() or marker.read_text() != " ".join(packages):
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "package.json").write_text('{"private": true}\n')
            subprocess.run([npm, "install", "--no-audit", "--no-fund", "--silent", *packages],
                           cwd=workdir, check=True, timeout=600)
            marker.write_text(" ".join(packages))
    return workdir


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    """Until url answers 200; fails at once if the process behind it exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"{proc.args[0]} exited: {err}")
        try:
            if requests.get(url, timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready")


def stop_processes(procs: list[subprocess.Popen], timeout: float = 10) -> None:
    """Terminate every process at once, then wait for each (killing what does not stop)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
