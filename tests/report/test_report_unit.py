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
