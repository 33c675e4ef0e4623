"""Hostile targets on loopback, all in one exporter beside a healthy target.

Each hostile server misbehaves in one way (1 byte/s headers or body, slow redirect chains,
10,000 models, 60,000 buckets, a 3 MiB label, +Inf and 1e308 counters, a password in the
URL). The healthy target must keep its schedule (>= 90% of its expected polls), the hostile
ones must end as the right reason, the exporter's own /metrics must stay small, and no
secret may appear in any output. The SIGTERM checks run the exporter as a subprocess.
"""

from __future__ import annotations

import logging
import math
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import requests

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab import exposition
from prefixwatch.exporter.config import (
    ConfigFlags,
    ExporterConfig,
    TargetConfig,
    build_config,
    name_targets,
)
from prefixwatch.exporter.monitor import TargetMonitor
from prefixwatch.exporter.service import Exporter
from tests.conftest import PageServer, with_counters

SECRET = "hunter2-s3cr3t"
TOKEN = "tok-9f8e7d6c5b"
INTERVAL = 0.5  # a 5 s interval compressed 10x: the hostile pages still cost real CPU
TIMEOUT = 0.6
RUN_SECONDS = 5.0


def _counter_page(models: int = 1, value: str = "10", extra: str = "", prefix: str = "m") -> str:
    lines = []
    for i in range(models):
        labels = f'engine="0",model_name="{prefix}{i}"{extra}'
        lines.append(f"vllm:prefix_cache_queries_total{{{labels}}} {value}")
        lines.append(f"vllm:prefix_cache_hits_total{{{labels}}} 5")
    return "\n".join(lines) + "\n"


def _bucket_page(buckets: int) -> str:
    lines = [_counter_page().rstrip("\n")]
    for i in range(buckets):
        lines.append('vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m0",'
                     f'le="{i / 1000:.3f}"}} {i}')
    lines.append('vllm:time_to_first_token_seconds_bucket{engine="0",model_name="m0",'
                 f'le="+Inf"}} {buckets}')
    return "\n".join(lines) + "\n"


class RawServer:
    """A loopback server whose every connection is handled by ``behave(conn, server)``."""

    def __init__(self, behave: Callable[[socket.socket, RawServer], None]) -> None:
        self.behave = behave
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.sock.settimeout(0.2)
        self.closed = threading.Event()
        self.accepted = 0
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(5)
            conn.recv(65536)  # the request
            self.behave(conn, self)
        except OSError:
            pass
        finally:
            conn.close()

    def trickle(self, conn: socket.socket, data: bytes, gap: float = 0.2) -> None:
        """One byte per ``gap`` seconds (scaled down from 1 byte/s to keep the test short:
        still far under the poll deadline per byte, so only a whole-exchange deadline
        catches it)."""
        for b in data:
            if self.closed.wait(gap):
                return
            conn.sendall(bytes([b]))

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


def slow_headers(conn: socket.socket, server: RawServer) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    server.trickle(conn, b"X-Slow: " + b"a" * 200 + b"\r\n\r\n")


def slow_body(conn: socket.socket, server: RawServer) -> None:
    body = _counter_page().encode() * 50
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n")
    server.trickle(conn, body)


def slow_redirects(conn: socket.socket, server: RawServer) -> None:
    time.sleep(0.3)  # each hop in time, the chain not
    conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: /metrics?hop\r\nContent-Length: 0\r\n\r\n")


def silent(conn: socket.socket, server: RawServer) -> None:
    server.closed.wait(30)  # accepts, reads the request, never answers


def _page_server(body: str) -> PageServer:
    server = PageServer()
    server.serve(body)
    return server


@pytest.fixture
def fleet(vllm_page: str, tmp_path: Path) -> Iterator[dict[str, object]]:
    raws = {"slow_headers": RawServer(slow_headers), "slow_body": RawServer(slow_body),
            "slow_redirects": RawServer(slow_redirects), "silent": RawServer(silent)}
    pages = {
        "healthy": _page_server(vllm_page),
        "models_10k": _page_server(_counter_page(10_000)),
        "buckets_60k": _page_server(_bucket_page(60_000)),
        "label_3mib": _page_server(_counter_page(extra=',lora="' + "x" * (3 << 20) + '"')),
        "plus_inf": _page_server(_counter_page(value="+Inf")),
        "overflow": _page_server(_counter_page(value="1e308")),
        "negative": _page_server(_counter_page(value="-1")),
        "nan": _page_server(_counter_page(value="NaN")),
        "secret": _page_server(vllm_page),
    }
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    targets = []
    for name, raw in raws.items():
        targets.append(TargetConfig(raw.url, name=name, timeout=TIMEOUT))
    big = ("models_10k", "buckets_60k", "label_3mib")
    for name, page in pages.items():
        url = page.url
        if name == "secret":
            url = url.replace("http://", f"http://admin:{SECRET}@")
        # Multi-MB pages, and the healthy pages that must stay up beside them, get a realistic
        # deadline: a parse holds the interpreter, and the polls share two busy cores. The
        # hostile peers keep the short one, which is what they are tested against.
        generous = name in big or name in ("healthy", "secret")
        targets.append(TargetConfig(url, name=name, timeout=2.0 if generous else TIMEOUT,
                                    bearer_token_file=str(token_file) if name == "healthy"
                                    else None))
    # A second, unnamed target at the secret's host:port: its label falls back to the URL.
    targets.append(TargetConfig(pages["secret"].url.replace("http://", f"http://u:{SECRET}@")
                                + "?token=" + TOKEN))
    targets.append(TargetConfig(pages["secret"].url.replace("/metrics", "/other")))
    cfg = ExporterConfig(targets=name_targets(targets), interval=INTERVAL,
                         listen_address="127.0.0.1:0", windows=("1m",))
    yield {"config": cfg, "pages": pages, "raws": raws}
    for s in (*raws.values(), *pages.values()):
        s.close()


def test_hostile_fleet_keeps_the_healthy_target_on_schedule(
        fleet: dict, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    exporter = Exporter(fleet["config"])
    healthy: PageServer = fleet["pages"]["healthy"]
    exporter.start()
    try:
        started = time.monotonic()
        time.sleep(RUN_SECONDS)
        polls = healthy.hits
        elapsed = time.monotonic() - started
        base = f"http://127.0.0.1:{exporter.port}"
        metrics = requests.get(base + "/metrics", timeout=5)
        landing = requests.get(base + "/", timeout=5).text
        health = requests.get(base + "/healthz", timeout=5)
    finally:
        exporter.stop()
    expected = elapsed / INTERVAL
    assert polls >= 0.9 * expected, f"healthy target polled {polls} times, expected {expected:.0f}"
    assert health.status_code == 200

    by_name = {v.name: v for v in exporter.views()}
    for name in ("slow_headers", "slow_body", "slow_redirects", "silent"):
        mon = by_name[name]
        # "timeout" alone shows the one deadline for the whole exchange: each byte, header
        # and hop comes in time, so without it these end otherwise (or after 30-40 s). The
        # duration bound is loose on purpose: two loaded cores delay the poll's threads.
        assert not mon.up and mon.reason == "timeout", (name, mon.reason, mon.last_error)
        assert mon.scrape_duration < TIMEOUT + 2.0, (name, mon.scrape_duration)
    for name in ("plus_inf", "overflow", "negative", "nan"):
        mon = by_name[name]  # never up; a poll may also time out on two busy cores
        assert mon.errors["invalid_value"] >= 1 and math.isnan(mon.last_success), name
    # Over a limit the page is still read (the count only grows on a read page).
    assert by_name["models_10k"].errors["too_many_series"] >= 1
    assert by_name["buckets_60k"].errors["too_many_series"] >= 1
    assert by_name["label_3mib"].errors["label_too_long"] >= 1
    # The secret target is here for what it must never show; that it was read at all is
    # enough (its last poll may miss its deadline on two saturated cores).
    assert by_name["healthy"].up and not math.isnan(by_name["secret"].last_success), (
        by_name["secret"].reason, by_name["secret"].last_error)
    assert healthy.headers[-1].get("Authorization") == f"Bearer {TOKEN}"

    # The exporter's own page stays small with all of that on its targets (how fast it is
    # served is benchmarks/bench_hostile.py's figure: a timing has no place in a test).
    assert len(metrics.content) < 3 * 1024 * 1024, len(metrics.content)
    assert 'reason="too_many_series"' in metrics.text
    assert exposition.OUT_LAST_SUCCESS.name + '{target="healthy"}' in metrics.text
    assert "limit reached" in landing and "too_many_series" in landing

    outputs = [metrics.text, landing, caplog.text]
    outputs += [f"{v.name} {v.last_error} {v.target.display_url}" for v in exporter.views()]
    for text in outputs:
        assert SECRET not in text and TOKEN not in text
    assert "***@" in landing


def test_healthz_fails_when_polling_is_stale(vllm_page: str) -> None:
    with _server(vllm_page) as server:
        cfg = ExporterConfig(targets=name_targets([TargetConfig(server.url, timeout=TIMEOUT)]),
                             interval=0.05, listen_address="127.0.0.1:0")
        exporter = Exporter(cfg)
        exporter.poll_round()
        assert exporter.healthy()[0]
        # Ten seconds on, nothing polled since (and the start long past).
        ok, why = exporter.healthy(time.monotonic() + 10)
        assert not ok and "no target polled" in why


class _server:
    def __init__(self, body: str) -> None:
        self.server = _page_server(body)

    def __enter__(self) -> PageServer:
        return self.server

    def __exit__(self, *exc: object) -> None:
        self.server.close()


def test_a_later_good_page_recovers_the_windows(vllm_page: str) -> None:
    mon = TargetMonitor(TargetConfig("http://127.0.0.1:1/metrics", name="t"), {"1m": 60.0}, 1.0)
    now = 1000.0
    mon.ingest(with_counters(vllm_page, 100, 50), now)
    for step in (1, 2):
        mon.ingest(with_counters(vllm_page, float("inf"), 50), now + step)
        assert mon.view.reason == "invalid_value"
    mon.ingest(with_counters(vllm_page, 200, 120), now + 3)
    assert mon.view.up
    ratios = [f.windows["1m"].hit_ratio for f in mon.view.models.values() if "1m" in f.windows]
    assert ratios and abs(ratios[0] - 0.7) < 1e-9


def test_an_engine_switch_is_logged_once(vllm_page: str,
                                         caplog: pytest.LogCaptureFixture) -> None:
    sglang = 'sglang:prompt_tokens_total{model_name="m"} 10\n'
    assert "sglang" in sglang
    mon = TargetMonitor(TargetConfig("http://127.0.0.1:1/metrics", name="t"), {"1m": 60.0}, 1.0)
    caplog.set_level(logging.WARNING, logger="prefixwatch.exporter")
    for i in range(6):
        mon.ingest(vllm_page if i % 2 == 0 else sglang, 1000.0 + i)
    switches = [r for r in caplog.records if "changed metric schema" in r.getMessage()]
    assert len(switches) == 2  # vllm -> sglang, sglang -> vllm; then quiet


def test_a_password_never_shows_in_config_errors() -> None:
    for url in (f"ftp://admin:{SECRET}@host/metrics", f"http://admin:{SECRET}@host:99999/m",
                f"http://admin:{SECRET}@[::1/metrics"):
        with pytest.raises(ConfigError) as info:
            build_config(ConfigFlags(targets=[url]), environ={})
        assert SECRET not in str(info.value) and "***@" in str(info.value)


def test_the_http_server_survives_slowloris(vllm_page: str) -> None:
    with _server(vllm_page) as server:
        cfg = ExporterConfig(targets=name_targets([TargetConfig(server.url, timeout=TIMEOUT)]),
                             interval=INTERVAL, listen_address="127.0.0.1:0")
        exporter = Exporter(cfg)
        exporter.start()
        held = []
        try:
            for _ in range(200):  # half-sent requests, more than workers + queue
                s = socket.create_connection(("127.0.0.1", exporter.port), timeout=2)
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
                held.append(s)
            deadline = time.monotonic() + 15
            answered = False
            while time.monotonic() < deadline and not answered:
                try:
                    answered = requests.get(f"http://127.0.0.1:{exporter.port}/metrics",
                                            timeout=2).status_code == 200
                except requests.RequestException:
                    time.sleep(0.2)
            assert answered, "no answer while slow clients held the server"
        finally:
            for s in held:
                s.close()
            exporter.stop()


def test_basic_auth_from_a_web_config_file(vllm_page: str, tmp_path: Path) -> None:
    bcrypt = pytest.importorskip("bcrypt")
    hashed = bcrypt.hashpw(SECRET.encode(), bcrypt.gensalt(4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    with _server(vllm_page) as server:
        cfg = ExporterConfig(targets=name_targets([TargetConfig(server.url)]),
                             listen_address="127.0.0.1:0", web_config_file=str(web))
        exporter = Exporter(cfg)
        exporter.start()
        try:
            url = f"http://127.0.0.1:{exporter.port}/metrics"
            assert requests.get(url, timeout=5).status_code == 401
            assert requests.get(url, auth=("prom", "wrong"), timeout=5).status_code == 401
            assert requests.get(url, auth=("prom", SECRET), timeout=5).status_code == 200
        finally:
            exporter.stop()


def _exporter_process(target: str) -> subprocess.Popen:
    """The exporter on a port of its own choosing (the test never connects to it)."""
    return subprocess.Popen(
        [sys.executable, "-m", "prefixwatch.cli", "exporter", "--target", target,
         "--interval", "0.2", "--timeout", "30", "--listen-address", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("behave", [slow_headers, slow_body, silent],
                         ids=["slow_headers", "slow_body", "silent"])
def test_sigterm_ends_the_process_within_2s(behave: Callable) -> None:
    raw = RawServer(behave)
    proc = _exporter_process(raw.url.replace("http://", f"http://a:{SECRET}@"))
    try:
        deadline = time.monotonic() + 20
        while raw.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # a poll is in flight (timeout 30 s: only SIGTERM can end it)
        assert raw.accepted, "the exporter never polled"
        time.sleep(0.3)
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=5)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        raw.close()
    assert took < 2.0, f"SIGTERM took {took:.2f}s"
    assert proc.returncode == 0, out
    assert SECRET not in out
    assert "no complete answer" not in out, out  # the poll SIGTERM cut off was no timeout


def test_a_poll_cut_off_by_stop_is_no_timeout_of_the_target() -> None:
    """The target's state stays what its last finished poll found: stopping is not its fault
    (no timeout counted, no 'is down' logged)."""
    raw = RawServer(silent)
    cfg = ExporterConfig(targets=name_targets([TargetConfig(raw.url, name="t", timeout=30.0)]),
                         interval=0.2, listen_address="127.0.0.1:0", windows=("1m",))
    exporter = Exporter(cfg)
    exporter.start()
    try:
        deadline = time.monotonic() + 20
        while raw.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # a poll is in flight (timeout 30 s: only stop can end it)
        assert raw.accepted, "the exporter never polled"
    finally:
        exporter.stop()
        raw.close()
    for thread in threading.enumerate():  # the cut-off poll's worker, done once it returns
        if re.fullmatch(r"poll-\d+", thread.name):
            thread.join(timeout=5)
            assert not thread.is_alive(), "a poll worker outlived stop"
    mon = exporter.monitors[0].view
    assert mon.errors["timeout"] == 0 and mon.reason is None and not mon.polled


def test_status_has_the_same_deadline() -> None:
    raw = RawServer(slow_body)
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "prefixwatch.cli", "status", "--target",
             raw.url.replace("http://", f"http://a:{SECRET}@"), "--timeout", "0.5",
             "--gap", "0.2"], capture_output=True, text=True, timeout=20)
        took = time.monotonic() - started
    finally:
        raw.close()
    # Two polls of 0.5 s, a 0.2 s gap and the interpreter's start; the trickling body alone
    # would take minutes, so a loose bound (a loaded machine) still shows the deadline.
    assert took < 15, took
    assert proc.returncode == 1 and "timeout" in proc.stdout
    assert SECRET not in proc.stdout + proc.stderr
