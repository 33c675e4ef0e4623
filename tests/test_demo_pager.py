"""The demo's page printer: a page sent before the exporter named a cause is followed on
Alertmanager's API and the cause printed once Alertmanager's copy of the alert names it; a
page that names its cause is printed once and not followed."""

from __future__ import annotations

import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

from prefixwatch.demo.pager import NotificationPrinter
from prefixwatch.mixin.alerts import NO_DIAGNOSIS

NAMED = "prefix_divergence (https://example.invalid/runbooks.md#prefix_divergence)"


def alert(diagnosis: str) -> dict:
    return {"status": "firing", "fingerprint": "f1", "startsAt": "2026-01-01T00:00:00Z",
            "labels": {"alertname": "PrefixCacheHitRateLow", "severity": "critical",
                       "model_name": "m"},
            "annotations": {"summary": "collapsed", "description": f"Text. Diagnosis: {diagnosis}",
                            "runbook_url": "https://example.invalid/runbooks.md#x"}}


class FakeAlertmanager:
    """/api/v2/alerts: the alert as Prometheus last sent it (``diagnosis`` may change)."""

    def __init__(self) -> None:
        self.diagnosis = NO_DIAGNOSIS
        self.asked = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                outer.asked += 1
                body = json.dumps([alert(outer.diagnosis)]).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_page_before_the_diagnosis_gets_the_cause_once_it_is_named() -> None:
    am, out = FakeAlertmanager(), io.StringIO()
    printer = NotificationPrinter(out, alertmanager_url=am.url)
    printer.FOLLOW_EVERY = 0.05
    try:
        requests.post(printer.url, json={"alerts": [alert(NO_DIAGNOSIS)]}, timeout=5)
        wait_until(lambda: am.asked >= 2)
        assert "diagnosis: none so far" in out.getvalue()
        am.diagnosis = NAMED
        wait_until(lambda: f"diagnosis: {NAMED} (named" in out.getvalue())
        asked = am.asked
        time.sleep(0.3)
        assert am.asked == asked, "the follower stops once the cause is named"
        assert out.getvalue().count("PAGE:") == 1 and printer.pages == 1
    finally:
        printer.stop()
        am.stop()


def test_a_page_that_names_its_cause_is_not_followed() -> None:
    am, out = FakeAlertmanager(), io.StringIO()
    printer = NotificationPrinter(out, alertmanager_url=am.url)
    printer.FOLLOW_EVERY = 0.05
    try:
        requests.post(printer.url, json={"alerts": [alert(NAMED)]}, timeout=5)
        wait_until(lambda: "PAGE:" in out.getvalue())
        time.sleep(0.3)
        assert am.asked == 0 and f"diagnosis: {NAMED}" in out.getvalue()
    finally:
        printer.stop()
        am.stop()
