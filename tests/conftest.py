"""Shared test helpers: a loopback HTTP server whose answer each test controls."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import requests

FIXTURES = Path(__file__).parent / "fixtures"


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
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
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
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def npm_packages(name: str, packages: tuple[str, ...]) -> Path:
    """A directory with these npm packages installed (cached under ~/.cache/prefixwatch)."""
    import os
    import subprocess

    npm = require_binary("npm", "npm")
    require_binary("node", "nodejs")
    cache = Path(os.environ.get("PREFIXWATCH_CACHE", Path.home() / ".cache" / "prefixwatch"))
    workdir = cache / name
    marker = workdir / ".installed"
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
