"""The demo's terminal shows the page as the page says it: the diagnosis, the culprit and the
largest miss each on its own line, in the alert's own words."""

from __future__ import annotations

from prefixwatch.demo.pager import format_notification


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
