"""The report against a real Prometheus fed by the simulator, and opened in real chromium.

One regression on loopback (static prompt, a timestamp lands at the top, rollback), rules
compressed 20x in time: the report's first firing is within one evaluation interval of the
moment Prometheus was seen firing, its before/during/after phases hold one workload each (no
phase reaches past the switch that ends it), and their hit ratios are within 0.02 of the
simulator's own counters over the same phases.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from prefixwatch.cli import main
from prefixwatch.core.vocab import rulenames, settings
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.report import Request, Written, write_report
from tests import browser
from tests.conftest import require_binary
from tests.report.loopback import LoopbackStack

EVALUATION = 1.0  # seconds, scrape and rule evaluation
TIME_SCALE = 0.05  # the stack's (LoopbackStack's default)
#: The window of the ratio that pages and that the report's phases leave out (1m, scaled).
WINDOW = parse_duration(settings.CRITICAL_SHORT_WINDOW) * TIME_SCALE
#: The phases' unit: the window, but at least six evaluations, so that a phase's ratio rests
#: on enough samples to match the simulator's truth on a loaded machine.
SPAN = max(WINDOW, 6 * EVALUATION)

# The tests share one run of the stack (the module fixture): one worker runs them all.
pytestmark = [pytest.mark.xdist_group("report-e2e"), pytest.mark.slow]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[LoopbackStack, Written, float]:
    prometheus = require_binary("prometheus", "prometheus")
    work = tmp_path_factory.mktemp("report")
    stack = LoopbackStack(work, prometheus, interval=EVALUATION, time_scale=TIME_SCALE)
    started = time.time()
    stack.start()
    try:
        # A before phase: the page's ratio recorded, and healthy, for three of its windows.
        stack.wait_for(lambda: healthy_for(stack, 3 * SPAN), 60, "a healthy before phase")
        stack.switch("timestamp-at-top")
        stack.wait_for(lambda: rulenames.ALERT_LOW in stack.firing_seen, 60, "the page")
        time.sleep(1.5 * SPAN)  # more incident traffic: a during phase of several windows
        stack.switch("static-system-prompt")
        stack.wait_for(lambda: (stack.fleet_ratio_now() or 0) > 0.8, 30, "the recovery")
        time.sleep(2 * SPAN)  # more healthy traffic: an after phase of two windows
        written = write_report(stack.prom_url, work / "out", Request(
            started, time.time(), 0.7, time_scale=stack.time_scale))
    except BaseException:
        stack.stop()
        raise
    yield stack, written, started
    stack.stop()


def healthy_for(stack: LoopbackStack, seconds: float) -> bool:
    """The fleet's recorded ratio that pages has a sample every evaluation for ``seconds``,
    every one above 0.8."""
    ratio = rulenames.r_effective(rulenames.MODEL, settings.CRITICAL_SHORT_WINDOW)
    span = f"{int(seconds)}s"
    found = stack.query(f"count_over_time({ratio}[{span}]) >= {int(seconds / EVALUATION) - 1}"
                        f" and min_over_time({ratio}[{span}]) > 0.8")
    return bool(found)


@pytest.mark.integration
def test_first_firing_within_one_evaluation(run) -> None:
    stack, written, _ = run
    low = [a for a in written.data.alerts if a.name == rulenames.ALERT_LOW]
    assert low, written.data.alerts
    assert low[0].severity == "critical"
    assert abs(low[0].interval.start - stack.firing_seen[rulenames.ALERT_LOW]) <= EVALUATION
    assert not low[-1].interval.open, "resolved after the rollback"
    assert low[0].active_since is not None and low[0].active_since < low[0].interval.start


@pytest.mark.integration
def test_phases_hold_one_workload_each(run) -> None:
    """A phase never reaches past the switch that ends it, though Prometheus sees each switch
    a scrape and an evaluation late; and no phase starts before the switch that begins it."""
    stack, written, _ = run
    regression, rollback = stack.switched_at
    phases = {p.phase.name: p.phase for p in written.data.phases}
    assert phases["before"].end <= regression
    assert regression <= phases["during"].start and phases["during"].end <= rollback
    assert rollback <= phases["after"].start


@pytest.mark.integration
def test_hit_ratios_match_the_simulator(run) -> None:
    stack, written, _ = run
    regression, rollback = stack.switched_at
    phases = {p.phase.name: p for p in written.data.phases}
    assert set(phases) == {"before", "during", "after"}, written.data.crossings
    # The truth over each phase, within the workload it names (the test above checks that
    # the phase lies inside it; here a late switch must not fail the ratio twice).
    workload = {"before": (0.0, regression), "during": (regression, rollback),
                "after": (rollback, float("inf"))}
    for name, stats in phases.items():
        low, high = workload[name]
        truth = stack.truth.ratio(max(stats.phase.start, low), min(stats.phase.end, high))
        assert stats.hit_ratio == pytest.approx(truth, abs=0.02), (name, stats, truth)
        assert len(stats.per_replica) == 2
    assert phases["before"].hit_ratio > 0.8 > 0.1 > phases["during"].hit_ratio
    assert phases["during"].ttft[0.5] > phases["before"].ttft[0.5]
    assert written.data.extra_recomputed_tokens > 0


@pytest.mark.integration
def test_writes_html_markdown_and_figures(run) -> None:
    _, written, _ = run
    names = sorted(p.name for p in written.figures)
    # Figure 2 from the exporter's tier series; figure 3 needs a request log (the ledger).
    assert names == ["figure1-hit-ratio-ttft.png", "figure1-hit-ratio-ttft.svg",
                     "figure2-tiers.png", "figure2-tiers.svg"]
    assert written.figures[0].read_bytes().startswith(b"\x89PNG")
    md = written.markdown.read_text()
    for needle in ("## Timeline", f"{rulenames.ALERT_LOW} (critical) firing", "resolved",
                   "recovered", "| device hit ratio, fleet (over ", "TTFT p95",
                   "recomputed because of the incident", "not available"):
        assert needle in md, needle
    html = written.html.read_text()
    assert "http://" not in html.replace(written.data.prometheus, "")  # nothing fetched


@pytest.mark.integration
def test_report_renders_in_chromium(run, tmp_path: Path) -> None:
    _, written, _ = run
    url = written.html.resolve().as_uri()
    loaded = browser.load(url)
    assert loaded.dom.count('class="report-figure"') == 2
    # Figure 3: no ledger without a request log; figure 4: no pool curve without KV streams.
    assert loaded.dom.count('class="na"') == 2
    assert loaded.console_errors == []
    shot = tmp_path / "report.png"
    assert browser.screenshot(url, shot) == []
    assert browser.non_blank(shot)


@pytest.mark.integration
def test_cli_unknown_model_and_empty_range_exit_2(run, capsys, tmp_path: Path) -> None:
    stack, _, started = run
    base = ["report", "--prometheus", stack.prom_url, "--out", str(tmp_path)]
    assert main([*base, "--since", "10m", "--model", "no-such-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "unknown" in err and "Llama" in err
    assert main([*base, "--from", str(started - 7200), "--to", str(started - 3600)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no prefixwatch series" in err
    assert main([*base, "--since", "10m", "--threshold", "0.5"]) == 0
    assert (tmp_path / "report.html").exists()
