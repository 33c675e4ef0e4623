"""The report's pure parts and its errors without a Prometheus."""

from __future__ import annotations

import pytest

from prefixwatch.cli import main
from prefixwatch.report.cli import parse_time
from prefixwatch.report.timeline import Interval, crossings, merge, phases, runs


def test_unreachable_prometheus_is_one_line_and_exit_2(capsys, tmp_path) -> None:
    from tests.conftest import refused_port

    with refused_port() as port:
        url = f"http://127.0.0.1:{port}"
        assert main(["report", "--prometheus", url, "--since", "1h", "--out", str(tmp_path)]
                    ) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach Prometheus" in err and url in err


def test_bad_flags_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse's own one line: a bad duration
        main(["report", "--prometheus", "http://x", "--since", "soon"])
    assert exited.value.code == 2
    assert main(["report", "--prometheus", "ftp://x", "--since", "1h"]) == 2
    assert main(["report", "--prometheus", "http://x", "--from", "2026-01-02T00:00:00Z",
                 "--to", "2026-01-01T00:00:00Z"]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_parse_time() -> None:
    assert parse_time("2026-01-01T00:00:00Z") == parse_time("1767225600")


def test_crossings_and_phases_leave_out_the_transition_window() -> None:
    samples = [(t, 0.9 if t < 30 or t >= 60 else 0.05) for t in range(0, 100)]
    cross = crossings(samples, 0.7)
    assert (cross.first_drop, cross.recovery, cross.low_at_start) == (30, 60, False)
    got = [(p.name, p.start, p.end) for p in phases(0, 99, cross, 5)]
    assert got == [("before", 0, 25), ("during", 30, 55), ("after", 60, 99)]
    # A sample describes traffic one scrape and one evaluation old: a phase that ends at a
    # transition ends that much earlier again.
    got = [(p.name, p.start, p.end) for p in phases(0, 99, cross, 5, delay=2)]
    assert got == [("before", 0, 23), ("during", 30, 53), ("after", 60, 99)]


def test_no_recovery_means_during_to_the_end() -> None:
    cross = crossings([(0, 0.9), (10, 0.2), (20, 0.9), (30, 0.1)], 0.7)
    assert cross.first_drop == 10 and cross.recovery is None
    assert [p.name for p in phases(0, 40, cross, 5)] == ["before", "during"]


def test_runs_split_on_gaps_and_mark_open_intervals() -> None:
    samples = [(t, 1.0) for t in (0, 1, 2, 3)] + [(t, 1.0) for t in (10, 11, 12)]
    assert runs(samples, 1.0, end=12) == [Interval(0, 3), Interval(10, 12, open=True)]
    flags = [(0, 0.0), (1, 1.0), (2, 1.0), (3, 0.0)]
    assert runs(flags, 1.0, end=20, holds=lambda v: v >= 1) == [Interval(1, 2)]
    assert merge([Interval(0, 5), Interval(3, 8), Interval(10, 11)]) == [
        Interval(0, 8), Interval(10, 11)]


@pytest.mark.parametrize("value", ["yesterday", "2026-13-01"])
def test_parse_time_rejects(value: str) -> None:
    from prefixwatch.core.errors import ConfigError

    with pytest.raises(ConfigError):
        parse_time(value)


def _data(**extra):
    """A report's data for one simulated incident at time scale 0.05: healthy, a cold start
    that ended before the drop, then prefix_divergence from the drop on."""
    from prefixwatch.report.model import PhaseStats, ReportData
    from prefixwatch.report.timeline import AlertFiring, Crossings, Phase

    def stats(name: str, start: float, end: float, value: float) -> PhaseStats:
        return PhaseStats(Phase(name, start, end), value, value,
                          {"r0": value, "r1": value}, {0.5: 0.1, 0.95: 0.2}, 1e6, 1e6 * value,
                          judged=value)

    fields = dict(
        prometheus="http://p", model="m", models=["m"], start=0.0, end=100.0, step=1.0,
        window=6.000000000000001, threshold=0.7, fleet=[(t, 0.9 if t < 44 else 0.008)
                                                         for t in range(100)],
        device=[], replicas={}, ttft={}, diagnosis={
            "cold_start": [("r0", Interval(0.0, 30.0))],
            "prefix_divergence": [("r0", Interval(45.0, 100.0, open=True))]},
        alerts=[AlertFiring("PrefixCacheHitRateLow", "critical", {}, Interval(50.0, 100.0,
                                                                              open=True))],
        crossings=Crossings(first_drop=44.0), phases=[stats("before", 6, 38, 0.88),
                                                       stats("during", 50, 100, 0.008)],
        tiers=None, ledger=None, replica_window=15.0,
        culprit="a date/time at token 22 of the prompt changes on every request")
    return ReportData(**{**fields, **extra})


def test_summary_tells_the_story_with_the_root_cause_that_held_at_the_drop() -> None:
    from prefixwatch.report.render import render_html, render_markdown

    data = _data()
    md, page = render_markdown(data, []), render_html(data, [])
    story = ("fleet effective hit ratio 0.8% over 6s; cause: prefix_divergence; culprit: a "
             "date/time at token 22 of the prompt changes on every request")
    for text in (md, page):
        assert story in text and "Summary" in text
        assert "Root cause: prefix_divergence: a date/time at token 22" in text.replace(
            "<li>", "")
        assert "cold_start" not in text.split("Summary")[1].split("Timeline")[0]
    assert "88.0% -> 0.8%" in md
    assert "replica r0 (over 15s)" in md and "fleet (over 6s)" in md  # each its own window
    assert "(2m, 6s)" not in md


def test_impact_says_why_a_side_is_missing() -> None:
    from prefixwatch.report.render import render_markdown

    md = render_markdown(_data(phases=[]), [])
    assert "- -> -" not in md
    assert "the range holds no phase longer than the 6s window" in md


def test_the_ledger_stack_never_passes_all_the_prompt_tokens() -> None:
    from prefixwatch.report.figures import stackable_shares

    ledger = {"achieved": [(0, 0.01)], "layout": [(0, 0.85)], "novel": [(0, 0.2)],
              "unexplained": [(0, -0.06)], "output": [(0, 0.02)]}
    shares = stackable_shares(ledger)
    assert "output" not in shares
    assert sum(v for s in shares.values() for _, v in s) == pytest.approx(1.0)
    assert dict(shares["unexplained"])[0] == 0.0


def test_the_rules_time_scale_is_read_from_prometheus() -> None:
    """Without --config, a report on the demo's Prometheus reads the windows that paged."""
    from prefixwatch.core.story import window_words
    from prefixwatch.core.vocab import rulenames, settings
    from prefixwatch.core.vocab.windows import parse_duration
    from prefixwatch.report.collect import Collector
    from prefixwatch.report.model import Request, recorded
    from prefixwatch.report.promapi import RecordingRule

    class Rules:
        base = "http://p"

        def recording_rules(self) -> dict[str, RecordingRule]:
            num = recorded(settings.HIT_RATIO_EFFECTIVE, settings.CRITICAL_SHORT_WINDOW).num
            scaled = window_words(0.05 * parse_duration(settings.CRITICAL_SHORT_WINDOW))
            return {num: RecordingRule("sum by (model_name) (rate("
                                       f"prefixwatch_prompt_tokens_cached_total[{scaled}]))", 1.5),
                    rulenames.R_LEDGER_SHARE: RecordingRule("x", 1.5)}

    collector = Collector(Rules(), Request(0, 100, 0.7))  # type: ignore[arg-type]
    assert collector.req.time_scale == pytest.approx(0.05)
    assert collector.window == pytest.approx(0.05 * parse_duration(settings.CRITICAL_SHORT_WINDOW))
    assert "time scale 0.05" in collector.notes[0]
    assert collector.delay == 3.0  # one scrape and one evaluation of the rule's group


def test_one_deadline_for_all_the_reports_queries() -> None:
    """A Prometheus that answers every query, slowly, fails the report once within its
    --timeout, not once a query (each request gets what is left of the one deadline)."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prefixwatch.report.promapi import PromClient, ReportError

    class Slow(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            time.sleep(0.3)
            body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = PromClient(f"http://127.0.0.1:{server.server_address[1]}", timeout=1.0)
        began = time.monotonic()
        answered = 0
        with pytest.raises(ReportError, match=r"did not answer the report's queries within 1s"):
            for _ in range(20):
                client.query("up", 0)
                answered += 1
        assert 1 <= answered <= 3 and time.monotonic() - began < 1.5
        client.close()
    finally:
        server.shutdown()
        server.server_close()
