"""The sidecar: poll each target on its own schedule, serve /metrics, /healthz and /.

Each target has its own due time; a scheduler hands due targets to a fixed pool of poll
workers and never starts a target's poll while its previous one is still running. Every poll
ends by its target's deadline (scrape.py), so a slow target costs only its own polls. Every
``interval`` a housekeeping tick recomputes the diagnosis and runs the after-round hooks.
"""

from __future__ import annotations

import heapq
import logging
import math
import queue
import threading
import time
from collections.abc import Hashable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from prefixwatch.core.diagnosis import Diagnosis, diagnose, event_evidence
from prefixwatch.core.httpreply import ReplyHandler
from prefixwatch.core.story import Culprit, culprit_of
from prefixwatch.core.version import __version__
from prefixwatch.core.vocab import exposition, settings
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.exporter import scrape
from prefixwatch.exporter.charts import ChartCache
from prefixwatch.exporter.collector import DiagnosisState, PrefixwatchCollector
from prefixwatch.exporter.config import ExporterConfig
from prefixwatch.exporter.evidence import evidence_for
from prefixwatch.exporter.http import READ_TIMEOUT, BoundedHTTPServer
from prefixwatch.exporter.kvsubscriber import KvEvents
from prefixwatch.exporter.kvsubscriber.kinds import recent_divergences
from prefixwatch.exporter.kvsubscriber.ledgerseries import SETTLE_SECONDS, EventLedgers
from prefixwatch.exporter.kvsubscriber.whatif import page_pool_blocks
from prefixwatch.exporter.landing import LandingInputs, render_landing
from prefixwatch.exporter.monitor import TargetMonitor, TargetView
from prefixwatch.exporter.pagereader import CACHED
from prefixwatch.exporter.requestlog.reader import RequestsLogReader
from prefixwatch.exporter.requestlog.view import RequestView
from prefixwatch.exporter.webconfig import WebConfig, load_web_config

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
            self.view = RequestView(max_requests=rl.max_requests, max_blocks=rl.max_blocks,
                                    pool_blocks=self.pool_blocks)
            self.view.ledger.single_replica = len(self.monitors) == 1
            self._pool_sizes: tuple[float, dict[str, int]] = (-math.inf, {})
            self.reader = RequestsLogReader(rl, self.view, config.targets[0].url)
        self.state = DiagnosisState(config.diagnosis_window)
        #: The landing page's charts: the share of the ratio the threshold judges.
        self.charts = ChartCache(CACHED if config.hit_ratio_mode == settings.HIT_RATIO_EFFECTIVE
                                 else "hits")
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = PrefixwatchCollector(self.views, windows, self.state, self.view)
        if config.requests_log is not None:
            self.collector.view_model = config.requests_log.model
        self.kv = KvEvents(config, self.single_model)
        horizon = max([*windows.values(), 2 * self.diag_seconds]) + 2 * config.interval
        self.kv_ledgers = EventLedgers(self.kv.sources, horizon)
        if self.kv.enabled:
            self.collector.kv_sources = self.kv.all_sources
            self.collector.kv_ledgers = self.kv_ledgers
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.web = (load_web_config(config.web_config_file) if config.web_config_file
                    else WebConfig())
        self._workers = max(1, min(MAX_POLL_THREADS, len(self.monitors)))
        self._stop = threading.Event()
        self.rounds = 0
        self.round_listeners: list = []  # callables run after each round (OTLP export)
        self._server: BoundedHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._active: dict[tuple[str, str], list[str]] = {}
        self._jobs: queue.Queue[TargetMonitor | None] = queue.Queue()
        self._busy: set[str] = set()  # targets whose poll is queued or running
        self._busy_lock = threading.Lock()
        self._started = time.monotonic()

    def views(self) -> list[TargetView]:
        """Every target as its last poll left it."""
        return [mon.view for mon in self.monitors]

    # -- polling -------------------------------------------------------------------------------

    def poll_round(self) -> float:
        """Poll every target once, concurrently, then tick; returns the seconds it took.

        For tests and one-shot use; the running exporter polls each target on its own
        schedule (``_schedule``) and ticks on the interval."""
        started = time.monotonic()
        with ThreadPoolExecutor(self._workers, thread_name_prefix="poll") as pool:
            list(pool.map(self._poll, self.monitors))
        self.tick(started)
        return time.monotonic() - started

    def tick(self, started: float | None = None) -> None:
        """Recompute the diagnosis from the latest polls and run the after-round hooks."""
        started = time.monotonic() if started is None else started
        self.rounds += 1
        try:
            self.update_diagnosis(time.time())
        except Exception:  # a bug in a rule must not stop the polling
            log.exception("diagnosis failed")
        if self.rounds == 1 and self.reader is not None:
            self.reader.start()  # after the first round: the block size is known by then
        durations = [v.scrape_duration for v in self.views() if v.polled]
        # Polls run side by side: a "round" takes as long as its slowest poll.
        self.collector.round_seconds = max(durations, default=time.monotonic() - started)
        for listener in self.round_listeners:
            try:
                listener()
            except Exception:  # an OTLP hiccup must not stop the polling
                log.exception("after-round hook failed")

    def single_model(self, target: str) -> str | None:
        """The one model a target serves, from its last page (None: none yet, or several)."""
        for mon in self.monitors:
            if mon.name == target:
                models = set(mon.view.models)
                return models.pop() if len(models) == 1 else None
        return None

    def pool_blocks(self, replica: Hashable) -> int | None:
        """A replica's KV pool in blocks (num_gpu_blocks of its cache_config_info), for the
        ledger: the target of that name or address; without one, the one size every target
        reports (a homogeneous fleet); None when not known."""
        at, sizes = self._pool_sizes
        if time.monotonic() - at > 1.0:
            sizes = {}
            for view in self.views():
                value = page_pool_blocks(view)
                if value is not None:
                    sizes[view.name] = sizes[urlsplit(view.target.url).netloc] = value
            self._pool_sizes = (time.monotonic(), sizes)
        if isinstance(replica, str) and replica in sizes:
            return sizes[replica]
        if replica is None and len(self.monitors) != 1:
            return None  # one log for several pools: eviction is not separable
        values = set(sizes.values())
        return values.pop() if len(values) == 1 and sizes else None

    def update_diagnosis(self, now: float) -> None:
        """Recompute every target's and model's causes from the latest poll."""
        evidence = {view.name: evidence_for(view, now, self.diag_seconds) if view.up else {}
                    for view in self.views()}
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
        for model in self.kv_ledgers.models():
            # The event source measures the ledger: it wins over a request log's replay.
            span = self.kv_ledgers.model_span(model, self.diag_seconds)
            if span is not None:
                requests[model] = event_evidence(span.shares, span.prompt, span.requests)
        result = diagnose(evidence, requests, self.config.thresholds, self.cold_seconds,
                          self.config.hit_ratio_mode)
        self.state.update(result, requests, kinds)
        found = self.culprits(now, self.diag_seconds)
        with self.state.lock:
            self.state.culprits = found
        self._log_changes(result)

    def culprits(self, now: float, seconds: float) -> dict[str, Culprit]:
        """Each model's culprit over the last ``seconds``: from the KV event streams (they
        see every request), else from the requests log (core/story.py names it)."""
        found = {model: c for model, counts in
                 recent_divergences(self.kv.all_sources(), now - seconds).items()
                 if (c := culprit_of(counts)) is not None}
        if self.view is not None:
            wanted = self.config.requests_log.model if self.config.requests_log else None
            from_log = culprit_of(self.view.divergences(seconds))
            models = [wanted] if wanted else sorted({m for _t, m in self.state.latest().causes})
            for model in models:
                if from_log is not None and model not in found:
                    found[model] = from_log
        return found

    def _log_changes(self, result: Diagnosis) -> None:
        """Say so when a target's causes change (not on every round); a one-shot reader
        (`status`, which prints its own diagnosis) sets ``log_diagnosis`` False."""
        if not getattr(self, "log_diagnosis", True):
            return
        for key, causes in result.causes.items():
            active = sorted(c for c, on in causes.items() if on)
            before = self._active.get(key)
            if active != (before or []):
                level = logging.WARNING if active else logging.INFO
                text = ", ".join(active) if active else "no cause holds any more"
                if "eviction_pressure" in active:  # how much memory would win it back
                    words = self.kv_ledgers.whatif.target_words(key[0], self.diag_seconds)
                    text += f" ({words})" if words else ""
                log.log(level, "diagnosis of %s on %s: %s", key[1], key[0], text)
            self._active[key] = active

    def _schedule(self) -> None:
        """Hand each target to the poll workers when it is due; tick every interval."""
        interval = self.config.interval
        now = time.monotonic()
        due: list[tuple[float, int]] = [(now, i) for i in range(len(self.monitors))]
        heapq.heapify(due)
        next_tick = now + interval
        late_logged: set[str] = set()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_tick:
                try:
                    self.tick()
                except Exception:  # pragma: no cover - the tick guards its own parts
                    log.exception("tick failed")
                next_tick = max(next_tick + interval, time.monotonic())
                continue
            when, index = due[0]
            if when > now:
                self._stop.wait(min(when, next_tick) - now)
                continue
            heapq.heappop(due)
            mon = self.monitors[index]
            with self._busy_lock:
                running = mon.name in self._busy
                if not running:
                    self._busy.add(mon.name)
            if running:
                if mon.name not in late_logged:
                    log.warning("target %s: a poll is still running when the next is due "
                                "(timeout %gs, interval %gs); skipping it", mon.name,
                                mon.target.timeout, interval)
                    late_logged.add(mon.name)
            else:
                self._jobs.put(mon)
            nxt = when + interval
            heapq.heappush(due, (nxt if nxt > now else now + interval, index))

    def _poll_worker(self) -> None:
        while True:
            mon = self._jobs.get()
            if mon is None or self._stop.is_set():
                return
            try:
                self._poll(mon)
            finally:
                with self._busy_lock:
                    self._busy.discard(mon.name)

    def _poll(self, mon: TargetMonitor) -> None:
        """Poll one target, and sample its event ledger beside the page just read. A bug in
        the event ledger is logged and never stops the polling (both of its readings)."""
        try:
            before = self.kv_ledgers.before_poll(mon.name)
        except Exception:
            log.exception("kv event ledger failed")
            before = None
        mon.poll()
        if before is not None:
            self._stop.wait(SETTLE_SECONDS)
        try:
            self.kv_ledgers.after_poll(mon.view, before, time.time())
        except Exception:
            log.exception("kv event ledger failed")

    def healthy(self, now: float | None = None) -> tuple[bool, str]:
        """False when no target was polled (whatever the outcome) within a few intervals:
        the polling itself is stuck, whatever ``up`` says. ``now``: time.monotonic()'s."""
        interval = self.config.interval
        slack = exposition.HEALTHZ_STALE_INTERVALS * interval + max(
            (m.target.timeout for m in self.monitors), default=0.0)
        now = time.monotonic() if now is None else now
        if now - self._started < slack:
            return True, "ok"
        last = max((v.last_polled for v in self.views() if v.last_polled is not None),
                   default=None)
        if last is None or now - last > slack:
            return False, f"no target polled in the last {slack:g}s"
        return True, "ok"

    # -- serving -------------------------------------------------------------------------------

    def start(self) -> None:
        host, port = self.config.listen_host_port
        handler = _make_handler(self)
        self._server = BoundedHTTPServer((host, port), handler, self.web.ssl_context)
        self._started = time.monotonic()
        jobs = [(self._server.serve_forever, "http"), (self._schedule, "scheduler")]
        jobs += [(self._poll_worker, f"poll-{i}") for i in range(self._workers)]
        for target, name in jobs:
            # Daemon threads only: a stuck thread must never keep the process alive.
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        self.kv.start()
        scheme = "https" if self.web.ssl_context else "http"
        log.info("prefixwatch %s listening on %s://%s:%d/metrics%s, polling %d target(s) "
                 "every %gs", __version__, scheme, host, self.port,
                 " (basic auth)" if self.web.users else "", len(self.monitors),
                 self.config.interval)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    def stop(self) -> None:
        """End within a second or so whatever is in flight: polls are cut off by the
        watchdog, and every thread is a daemon joined with a short timeout."""
        self._stop.set()
        scrape.abort_all()
        self.kv.stop()
        for _ in range(self._workers):
            self._jobs.put(None)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        deadline = time.monotonic() + 1.0
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if self.reader is not None:
            self.reader.stop()

    def wait(self) -> None:
        while not self._stop.wait(1.0):
            pass

    def landing_inputs(self) -> LandingInputs:
        """What the landing page reads, as of now."""
        return LandingInputs(
            self.config, tuple(self.views()), self.state.latest(), self.diag_seconds,
            self.charts, tuple(s.view() for s in self.kv.all_sources()), self.kv_ledgers,
            self.view, self.state.latest_culprits())

    def landing_page(self) -> str:
        return render_landing(self.landing_inputs())


class ExporterHandler(ReplyHandler):
    """/metrics, /healthz and the landing page of one exporter (``_make_handler`` binds it)."""

    exporter: Exporter
    server_version = f"prefixwatch/{__version__}"
    timeout = READ_TIMEOUT  # per read or write; the server adds a per-connection deadline

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        log.debug("http: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        exporter = self.exporter
        if not exporter.web.allows(self.headers.get("Authorization")):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="prefixwatch"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        path = urlsplit(self.path).path
        if path == "/metrics":
            encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
            self._send(200, encoder(exporter.registry), ctype)
        elif path in ("/healthz", "/-/healthy"):
            ok, why = exporter.healthy()
            self._send(200 if ok else 503, f"{why}\n".encode(), "text/plain; charset=utf-8")
        elif path == "/":
            self._send(200, exporter.landing_page().encode(), "text/html; charset=utf-8")
        else:
            self._send(404, b"not found\n", "text/plain; charset=utf-8")

    do_HEAD = do_GET


def _make_handler(exporter: Exporter) -> type[ExporterHandler]:
    return type("Handler", (ExporterHandler,), {"exporter": exporter})
