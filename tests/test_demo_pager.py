"""The demo's page printer: the page as the page says it (the diagnosis, the culprit and the
largest miss each on its own line, in the alert's own words); a page sent before the exporter
named a cause or its culprit is followed on Alertmanager's API and each printed once
Alertmanager's copy of the alert names it; a page that names both is printed once and not
followed."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator

import pytest
import requests

from prefixwatch.demo.pager import NotificationPrinter, format_notification
from prefixwatch.mixin.alerts import NO_DIAGNOSIS
from tests.conftest import PageServer

NAMED = "prefix_divergence (https://example.invalid/runbooks.md#prefix_divergence)"
CULPRIT = "a date/time at token 10 of the prompt changes on every request"


def alert(diagnosis: str, culprit: str | None = CULPRIT) -> dict:
    named = f" Culprit: {culprit}." if culprit else ""
    return {"status": "firing", "fingerprint": "f1", "startsAt": "2026-01-01T00:00:00Z",
            "labels": {"alertname": "PrefixCacheHitRateLow", "severity": "critical",
                       "model_name": "m"},
            "annotations": {"summary": "collapsed",
                            "description": f"Text. Diagnosis: {diagnosis}{named}",
                            "runbook_url": "https://example.invalid/runbooks.md#x"}}


def says(alertmanager: PageServer, diagnosis: str, culprit: str | None = CULPRIT) -> None:
    """Alertmanager's /api/v2/alerts holds the alert with this diagnosis and culprit."""
    alertmanager.serve(json.dumps([alert(diagnosis, culprit)]), content_type="application/json")


@pytest.fixture
def printed(page_server: PageServer) -> Iterator[tuple[NotificationPrinter, io.StringIO]]:
    """The printer, following pages on ``page_server`` as Alertmanager, and what it printed."""
    out = io.StringIO()
    printer = NotificationPrinter(out, alertmanager_url=page_server.url.removesuffix("/metrics"))
    printer.FOLLOW_EVERY = 0.05
    yield printer, out
    printer.stop()


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_page_before_the_diagnosis_gets_the_cause_once_it_is_named(page_server, printed
                                                                     ) -> None:
    printer, out = printed
    says(page_server, NO_DIAGNOSIS, None)
    requests.post(printer.url, json={"alerts": [alert(NO_DIAGNOSIS, None)]}, timeout=5)
    wait_until(lambda: page_server.hits >= 2)
    assert "diagnosis: none so far" in out.getvalue() and "culprit" not in out.getvalue()
    says(page_server, NAMED)
    wait_until(lambda: f"diagnosis: {NAMED} (named" in out.getvalue())
    assert f"after the page)\n    culprit:   {CULPRIT}\n" in out.getvalue()  # named together
    asked = page_server.hits
    time.sleep(0.3)
    assert page_server.hits == asked, "the follower stops once the cause is named"
    assert out.getvalue().count("PAGE:") == 1 and printer.pages == 1


def test_a_page_that_names_its_cause_before_its_culprit_gets_the_culprit(page_server, printed
                                                                         ) -> None:
    """The culprit needs a few requests' divergences named: a page that fires within a
    second or two of the drop can name the cause first; the culprit follows, once."""
    printer, out = printed
    says(page_server, NAMED, None)
    requests.post(printer.url, json={"alerts": [alert(NAMED, None)]}, timeout=5)
    wait_until(lambda: page_server.hits >= 2)
    assert f"diagnosis: {NAMED}\n" in out.getvalue() and "culprit" not in out.getvalue()
    says(page_server, NAMED)
    wait_until(lambda: f"culprit:   {CULPRIT} (named" in out.getvalue())
    asked = page_server.hits
    time.sleep(0.3)
    assert page_server.hits == asked, "the follower stops once the culprit is named"
    assert out.getvalue().count("diagnosis:") == 1 and out.getvalue().count("culprit:") == 1


def test_a_page_that_names_its_cause_is_not_followed(page_server, printed) -> None:
    printer, out = printed
    requests.post(printer.url, json={"alerts": [alert(NAMED)]}, timeout=5)
    wait_until(lambda: "PAGE:" in out.getvalue())
    time.sleep(0.3)
    assert page_server.hits == 0 and f"diagnosis: {NAMED}" in out.getvalue()


def test_the_page_in_the_terminal_names_the_culprit() -> None:
    alert = {"status": "firing", "labels": {
        "alertname": "PrefixCacheHitRateLow", "severity": "critical", "model_name": "m"},
        "annotations": {
            "summary": "Prefix-cache hit rate of m collapsed to 0.8% over 6s.",
            "description": "The effective ... (a timestamp, an id, tool order). Diagnosis: "
                           "prefix_divergence (https://x/runbooks.md#prefix_divergence) "
                           "Culprit: a date/time at token 22 of the prompt changes on every "
                           "request. Largest miss: layout (46.1% of prompt tokens).",
            "runbook_url": "https://x/runbooks.md#prefixcachehitratelow"}}
    lines = format_notification(alert)
    assert lines[0].endswith("collapsed to 0.8% over 6s.")
    assert lines[1:4] == [
        "    diagnosis: prefix_divergence (https://x/runbooks.md#prefix_divergence)",
        "    culprit:   a date/time at token 22 of the prompt changes on every request",
        "    largest miss: layout (46.1% of prompt tokens)"]


def test_a_page_without_a_culprit_says_only_what_it_has() -> None:
    alert = {"status": "firing", "labels": {"alertname": "PrefixCacheHitRateLow",
                                            "severity": "critical"},
             "annotations": {"description": "Low. Diagnosis: none (no cause)."}}
    lines = format_notification(alert)
    assert lines[1] == "    diagnosis: none (no cause)."
    assert not any("culprit" in line for line in lines)
