"""The sidecar: poll targets concurrently on an interval, serve /metrics, /healthz and /."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from prefixwatch.core.diagnosis import Diagnosis, diagnose
from prefixwatch.core.version import __version__
from prefixwatch.core.windows import parse_duration
from prefixwatch.exporter.collector import DiagnosisState, PrefixwatchCollector
from prefixwatch.exporter.config import ExporterConfig
from prefixwatch.exporter.landing import render_landing
from prefixwatch.exporter.monitor import TargetMonitor, evidence_for
from prefixwatch.exporter.requestlog.reader import RequestsLogReader
from prefixwatch.exporter.requestlog.view import RequestView

log = logging.getLogger("prefixwatch.exporter")

MAX_POLL_THREADS = 64


class Exporter:
    def __init__(self, config: ExporterConfig) -> None:
        self.config = config
        windows = config.window_seconds
        self.diag_seconds = parse_duration(config.diagnosis_window)
        self.cold_seconds = parse_duration(config.cold_start)
        self.monitors = [TargetMonitor(t, windows, config.interval,
                                       extra_windows=(self.diag_seconds, 2 * self.diag_seconds))
                         for t in config.targets]
        self.view: RequestView | None = None
        self.reader: RequestsLogReader | None = None
        if config.requests_log is not None:
            rl = config.requests_log
            self.view = RequestView(max_requests=rl.max_requests, max_blocks=rl.max_blocks)
            self.reader = RequestsLogReader(rl, self.view, config.targets[0].url)
        self.state = DiagnosisState(config.diagnosis_window)
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = PrefixwatchCollector(self.monitors, windows, self.state, self.view)
        if config.requests_log is not None:
            self.collector.view_model = config.requests_log.model
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._pool = ThreadPoolExecutor(
            max_workers=max(1, min(MAX_POLL_THREADS, len(self.monitors))),
            thread_name_prefix="poll")
        self._stop = threading.Event()
        self.rounds = 0
        self.round_listeners: list = []  # callables run after each round (OTLP export)
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._active: dict[tuple[str, str], list[str]] = {}

    # -- polling -------------------------------------------------------------------------------

    def poll_round(self) -> float:
        """Poll every target once, concurrently; returns the seconds it took."""
        started = time.monotonic()
        list(self._pool.map(lambda m: m.poll(), self.monitors))
        self.rounds += 1
        try:
            self.update_diagnosis(time.time())
        except Exception:  # a bug in a rule must not stop the polling
            log.exception("diagnosis failed")
        if self.rounds == 1 and self.reader is not None:
            self.reader.start()  # after the first round: the block size is known by then
        self.collector.round_seconds = time.monotonic() - started
        for listener in self.round_listeners:
            try:
                listener()
            except Exception:  # an OTLP hiccup must not stop the polling
                log.exception("after-round hook failed")
        return time.monotonic() - started

    def update_diagnosis(self, now: float) -> None:
        """Recompute every target's and model's causes from the latest poll."""
        evidence = {}
        for mon in self.monitors:
            with mon.lock:
                evidence[mon.name] = evidence_for(mon, now, self.diag_seconds) if mon.up else {}
        models = {m for per in evidence.values() for m in per}
        requests = {}
        kinds = {}
        if self.view is not None:
            sizes = {ev.block_size for per in evidence.values() for ev in per.values()
                     if ev.block_size}
            if len(sizes) == 1 and self.view.set_block_size(sizes.pop()):
                log.info("requests log: block size %d, from the targets", self.view.block_size)
            req, kind_counts = self.view.evidence(self.diag_seconds)
            wanted = self.config.requests_log.model if self.config.requests_log else None
            for model in ([wanted] if wanted else sorted(models)):
                requests[model] = req
                kinds[model] = kind_counts
        result = diagnose(evidence, requests, self.config.thresholds, self.cold_seconds)
        self.state.update(result, requests, kinds)
        self._log_changes(result)

    def _log_changes(self, result: Diagnosis) -> None:
        """Say so when a target's causes change (not on every round)."""
        for key, causes in result.causes.items():
            active = sorted(c for c, on in causes.items() if on)
            before = self._active.get(key)
            if active != (before or []):
                level = logging.WARNING if active else logging.INFO
                log.log(level, "diagnosis of %s on %s: %s", key[1], key[0],
                        ", ".join(active) if active else "no cause holds any more")
            self._active[key] = active

    def _loop(self) -> None:
        interval = self.config.interval
        next_round = time.monotonic()
        late_logged = False
        while not self._stop.is_set():
            took = self.poll_round()
            next_round += interval
            now = time.monotonic()
            if now > next_round:
                if not late_logged:
                    log.warning("a poll round took %.2fs, longer than the %.2fs interval; "
                                "polling runs late", took, interval)
                    late_logged = True
                next_round = now
            else:
                late_logged = False
            self._stop.wait(max(0.0, next_round - time.monotonic()))

    # -- serving -------------------------------------------------------------------------------

    def start(self) -> None:
        host, port = self.config.listen_host_port
        handler = _make_handler(self)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        for target, name in ((self._server.serve_forever, "http"), (self._loop, "poller")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("prefixwatch %s listening on http://%s:%d/metrics, polling %d target(s) "
                 "every %gs", __version__, host, self.port, len(self.monitors),
                 self.config.interval)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.reader is not None:
            self.reader.stop()
        for mon in self.monitors:
            mon.close()

    def wait(self) -> None:
        while not self._stop.wait(1.0):
            pass

    # -- pages ---------------------------------------------------------------------------------

    def landing_page(self) -> str:
        return render_landing(self)


def _make_handler(exporter: Exporter) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"prefixwatch/{__version__}"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            log.debug("http: " + format, *args)

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = urlsplit(self.path).path
            if path == "/metrics":
                encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
                self._send(200, encoder(exporter.registry), ctype)
            elif path in ("/healthz", "/-/healthy"):
                self._send(200, b"ok\n", "text/plain; charset=utf-8")
            elif path == "/":
                self._send(200, exporter.landing_page().encode(), "text/html; charset=utf-8")
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        do_HEAD = do_GET

    return Handler
