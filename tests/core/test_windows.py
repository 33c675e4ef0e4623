"""Window math: Δhits/Δqueries, counter resets, undefined without traffic, quantiles."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.core.vocab.windows import (
    SeriesHistory,
    VectorLayout,
    histogram_quantile,
    parse_duration,
    plan_tiers,
    ratio,
)

LAYOUT = VectorLayout(("queries", "hits"), ())


def history() -> SeriesHistory:
    return SeriesHistory(LAYOUT, [(1.0, 1000.0), (30.0, 4000.0)], interval=1.0)


def test_durations() -> None:
    assert parse_duration("30s") == 30 and parse_duration("5m") == 300
    assert parse_duration("1h") == 3600 and parse_duration("1.5h") == 5400
    for bad in ("", "5", "m5", "-1m", "0s", "5 minutes"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_ratio_is_undefined_without_queries() -> None:
    assert ratio(0, 0) is None
    assert ratio(math.nan, 10) is None
    assert ratio(5, 10) == 0.5


def test_window_delta_and_ratio() -> None:
    h = history()
    h.add(0, [1000, 900])
    h.add(60, [2000, 1800])
    h.add(120, [3000, 1830])  # the collapse: 30 hits in 1000 queries
    dt, delta = h.delta(120, 60)
    assert dt == 60 and list(delta) == [1000, 30]
    dt, delta = h.delta(120, 120)
    assert dt == 120 and list(delta) == [2000, 930]


def test_no_traffic_window_has_zero_queries() -> None:
    h = history()
    h.add(0, [500, 400])
    h.add(60, [500, 400])
    _, delta = h.delta(60, 60)
    assert ratio(delta[1], delta[0]) is None


def test_counter_reset_counts_the_new_value() -> None:
    h = history()
    h.add(0, [10_000, 9_000])
    h.add(15, [11_000, 9_900])
    assert h.add(30, [300, 30])  # restart: counters went down
    _, delta = h.delta(30, 30)
    assert list(delta) == [1_300, 930]
    assert h.resets == 1


def test_created_timestamp_reveals_a_restart_that_outgrew_the_old_value() -> None:
    h = history()
    h.add(0, [100, 90], created=1000.0)
    assert h.add(15, [500, 10], created=1010.0)  # new process, already past 100 queries
    _, delta = h.delta(15, 15)
    assert list(delta) == [500, 10]


def test_single_point_has_no_window() -> None:
    h = history()
    h.add(0, [1, 1])
    assert h.delta(0, 60) is None


def test_missing_counter_is_a_new_baseline() -> None:
    h = history()
    h.add(0, [100, math.nan])
    h.add(10, [200, 50])
    h.add(20, [300, 80])
    _, delta = h.delta(20, 20)
    assert delta[0] == 200 and delta[1] == 30


def test_tiers_keep_about_60_points_per_window() -> None:
    tiers = plan_tiers([60, 300, 900, 3600], interval=5)
    assert tiers == ((5, 310), (15, 930), (60, 3720))
    h = SeriesHistory(LAYOUT, tiers, interval=5)
    for i in range(0, 3 * 3600, 5):
        h.add(i + (0.3 if i % 2 else 0), [i * 10.0, i * 9.0])  # polls jitter a little
    assert h.points <= 64 + 64 + 64
    now = 3 * 3600 - 5
    for window, slack in ((60, 5), (300, 5), (900, 15), (3600, 60)):
        dt, delta = h.delta(now, window)
        assert window <= dt <= window + slack + 1, window
        assert delta[1] / delta[0] == pytest.approx(0.9)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 5000), st.booleans()),
                      min_size=2, max_size=60),
       window_steps=st.integers(1, 60))
def test_window_delta_equals_sum_of_increments(steps, window_steps) -> None:
    """Whatever the restarts, a window's delta is the traffic that happened in it."""
    h = SeriesHistory(LAYOUT, [(1.0, 10_000.0)], interval=1.0)
    raw_q = raw_h = 0.0
    increments = []
    for i, (dq, dh_, restart) in enumerate(steps):
        dh = min(dh_, dq)
        if restart and i > 0:
            raw_q, raw_h = 0.0, 0.0
            dq, dh = dq + 1, dh  # a restarted server has served at least one query
        raw_q += dq
        raw_h += dh
        increments.append((dq, dh) if i > 0 else (0, 0))
        h.add(float(i), [raw_q, raw_h])
    last = len(steps) - 1
    delta = h.delta(float(last), float(window_steps))
    first = max(0, last - window_steps)
    want_q = sum(q for q, _ in increments[first + 1:])
    want_h = sum(x for _, x in increments[first + 1:])
    assert delta is not None
    _, d = delta
    # A restart is only visible when the counter went down; an increase that hides a restart
    # between two polls is undercounted, as in Prometheus.
    assert d[0] <= want_q and d[1] <= want_h
    assert d[0] >= 0 and d[1] >= 0
    if not any(r for _, _, r in steps[first + 1:]):
        assert d[0] == want_q and d[1] == want_h


def brute_quantile(q: float, bounds: list[float], cumulative: list[float]) -> float | None:
    """Prometheus' algorithm, written out the slow way as a reference."""
    total = cumulative[-1]
    if total <= 0:
        return None
    rank = q * total
    idx = next(i for i, c in enumerate(cumulative) if c >= rank)
    if idx == len(bounds) - 1:
        return bounds[-2]
    start = 0.0 if idx == 0 else bounds[idx - 1]
    below = 0.0 if idx == 0 else cumulative[idx - 1]
    count = cumulative[idx] - below
    if count == 0:
        return bounds[idx]
    return start + (bounds[idx] - start) * (rank - below) / count


@settings(max_examples=300, deadline=None)
@given(counts=st.lists(st.integers(0, 50), min_size=3, max_size=10),
       q=st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_histogram_quantile_matches_reference(counts, q) -> None:
    bounds = [0.1 * (i + 1) for i in range(len(counts) - 1)] + [math.inf]
    cumulative = []
    running = 0
    for c in counts:
        running += c
        cumulative.append(float(running))
    got = histogram_quantile(q, bounds, cumulative)
    want = brute_quantile(q, bounds, cumulative)
    if want is None:
        assert got is None
    else:
        assert got == pytest.approx(want)


def test_quantile_of_real_shape() -> None:
    bounds = [0.1, 0.25, 0.5, 1.0, math.inf]
    cumulative = [0, 50, 100, 100, 100]
    assert histogram_quantile(0.5, bounds, cumulative) == pytest.approx(0.25)
    assert histogram_quantile(0.95, bounds, cumulative) == pytest.approx(0.475)
    assert histogram_quantile(0.5, bounds, [0, 0, 0, 0, 0]) is None
