"""The demo's own Alertmanager receiver: each page and resolution printed as it happens,
with the alert's summary, the diagnosis and the runbook link."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
import threading
import time
import urllib.request
from collections import deque
from http.server import ThreadingHTTPServer
from typing import Any

from prefixwatch.core.httpreply import ReplyHandler
from prefixwatch.core.vocab import rulenames
from prefixwatch.mixin import alertmanager
from prefixwatch.mixin.alerts import NOT_YET

log = logging.getLogger("prefixwatch.demo")


#: The clauses the alert rules append to a description, in their order.
CLAUSES = (("diagnosis", " Diagnosis: "), ("culprit", " Culprit: "),
           ("ledger", " Largest miss: "))


def clauses(description: str) -> dict[str, str]:
    """The ``Diagnosis:``, ``Culprit:`` and ``Largest miss:`` clauses of a description, each
    without its label ('-' for an absent diagnosis)."""
    found: dict[str, str] = {}
    rest = description
    for name, mark in reversed(CLAUSES):
        head, sep, text = rest.partition(mark)
        if sep:
            found[name] = text.strip().rstrip(".") if name != "diagnosis" else text.strip()
            rest = head
    found.setdefault("diagnosis", "-")
    return found


def format_notification(alert: dict[str, Any]) -> list[str]:
    """A firing or resolved alert as the terminal shows it: what, the diagnosis, the runbook."""
    labels, notes = alert.get("labels", {}), alert.get("annotations", {})
    severity = labels.get("severity", "")
    if alert.get("status") == "resolved":
        head = "RESOLVED"
    else:
        head = {"critical": "PAGE", "warning": "TICKET"}.get(severity, "ALERT")
    model = labels.get("model_name")
    lines = [f"[{time.strftime('%H:%M:%S')}] {head}: {labels.get('alertname', '?')} "
             f"({severity or 'no severity'}{', model ' + model if model else ''}) "
             f"{notes.get('summary', '')}".rstrip()]
    if alert.get("status") != "resolved":
        said = clauses(notes.get("description", ""))
        lines.append(f"    diagnosis: {said['diagnosis']}")
        if "culprit" in said:
            lines.append(f"    culprit:   {said['culprit']}")
        if "ledger" in said:
            lines.append(f"    largest miss: {said['ledger']}")
    if notes.get("runbook_url"):
        lines.append(f"    runbook:   {notes['runbook_url']}")
    return lines


def _named(said: dict[str, str], clause: str) -> bool:
    if clause == "diagnosis":
        return not said["diagnosis"].startswith(NOT_YET) and said["diagnosis"] != "-"
    return clause in said


def _unnamed(said: dict[str, str]) -> set[str]:
    """The clauses a page was sent without: the diagnosis ("none so far") and the culprit."""
    return {c for c in ("diagnosis", "culprit") if not _named(said, c)}


def _named_since(said: dict[str, str], missing: set[str], after: float) -> list[str]:
    """The lines for the clauses of ``missing`` that ``said`` now names (removed from it)."""
    lines = []
    when = f" (named {after:.0f}s after the page)"
    if "diagnosis" in missing and _named(said, "diagnosis"):
        missing.discard("diagnosis")
        lines.append(f"    diagnosis: {said['diagnosis']}{when}")
        when = ""
    if "culprit" in missing and _named(said, "culprit"):
        missing.discard("culprit")
        lines.append(f"    culprit:   {said['culprit']}{when}")
    return lines


class NotificationPrinter:
    """Alertmanager's webhook receiver inside the demo: prints each page and resolution once
    (Alertmanager repeats them) and lists the recent ones on GET /. A page sent before the
    exporter's diagnosis named a cause (it says "none so far") or its culprit is followed on
    Alertmanager's API, which Prometheus keeps up to date, and each printed once named."""

    MAX_BODY = 1 << 20
    KEEP = 50
    #: How long a page's diagnosis is followed, and how often Alertmanager is asked.
    FOLLOW_SECONDS = 60.0
    FOLLOW_EVERY = 0.5

    def __init__(self, out=None, alertmanager_url: str | None = None) -> None:
        self.out = out or sys.stdout
        self.alertmanager_url = alertmanager_url
        self._stopped = threading.Event()
        self.recent: deque[str] = deque(maxlen=self.KEEP)
        self.pages = 0
        self._seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        printer = self

        class Handler(ReplyHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"") -> None:
                self._send(status, body, "text/plain; charset=utf-8")

            def do_GET(self) -> None:  # noqa: N802
                text = "\n".join(printer.recent) or "no page or resolution yet"
                self._answer(200, (text + "\n").encode())

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                if not 0 < length <= printer.MAX_BODY:
                    self._answer(413 if length else 400)
                    return
                try:
                    message = json.loads(self.rfile.read(length))
                except ValueError:
                    self._answer(400)
                    return
                printer.receive(message)
                self._answer(200)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="notifications",
                                        daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def receive(self, message: Any) -> None:
        alerts = message.get("alerts") if isinstance(message, dict) else None
        for alert in alerts if isinstance(alerts, list) else []:
            if not isinstance(alert, dict):
                continue
            labels = alert.get("labels") or {}
            if labels.get("alertname") == rulenames.ALERT_WATCHDOG:
                continue
            key = (str(alert.get("fingerprint")), str(alert.get("status")),
                   str(alert.get("startsAt")))
            with self._lock:
                if key in self._seen:
                    continue
                if len(self._seen) > 10_000:
                    self._seen.clear()
                self._seen.add(key)
                lines = format_notification(alert)
                page = alert.get("status") != "resolved" and labels.get("severity") == "critical"
                if page:
                    self.pages += 1
                self._print(lines)
            missing = _unnamed(clauses((alert.get("annotations") or {}).get("description", "")))
            if page and self.alertmanager_url and missing:
                threading.Thread(target=self._follow, name="diagnosis-follower", daemon=True,
                                 args=(str(alert.get("fingerprint")), time.monotonic(),
                                       missing)).start()

    def _print(self, lines: list[str]) -> None:
        self.recent.extend(lines)
        # A closed terminal (the demo is stopping) must not break the receiver.
        with contextlib.suppress(BrokenPipeError, ValueError):
            print("\n".join(lines), file=self.out, flush=True)

    def _follow(self, fingerprint: str, paged: float, missing: set[str]) -> None:
        """Print the page's diagnosis and culprit (the ones in ``missing``) once Alertmanager's
        copy of the alert names them."""
        url = f"{self.alertmanager_url.rstrip('/')}/api/v2/alerts"  # type: ignore[union-attr]
        while missing and not self._stopped.wait(self.FOLLOW_EVERY):
            if time.monotonic() - paged > self.FOLLOW_SECONDS:
                return
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    alerts = json.loads(answer.read(self.MAX_BODY))
            except (OSError, ValueError):
                continue
            for alert in alerts if isinstance(alerts, list) else []:
                if isinstance(alert, dict) and alert.get("fingerprint") == fingerprint:
                    said = clauses((alert.get("annotations") or {}).get("description", ""))
                    lines = _named_since(said, missing, time.monotonic() - paged)
                    if lines:
                        with self._lock:
                            self._print(lines)

    def stop(self) -> None:
        self._stopped.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def alertmanager_config(receiver_url: str, scale: float) -> dict[str, Any]:
    """The stack's routing with the demo's receiver beside the user's webhooks (and instead
    of the ``.invalid`` placeholders when none is set); the Watchdog is left alone."""
    cfg = alertmanager.config(time_scale=scale)
    placeholders = set(alertmanager.DEFAULT_URLS.values())
    for receiver in cfg.get("receivers", []):
        if receiver.get("name") == "watchdog":
            continue
        hooks = [h for h in receiver.get("webhook_configs", []) if h.get("url") not in
                 placeholders]
        receiver["webhook_configs"] = [*hooks, {"url": receiver_url, "send_resolved": True}]
    return cfg
