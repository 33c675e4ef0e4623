"""The pool what-if (core/kv/whatif.py) against the simulator run at the larger pools.

The same seeded scenario runs one request at a time at 1x, 1.5x and 2x its pool; the what-if
the mirror measures from the 1x run's KV event stream must be each larger run's delivered hit
ratio within 3 points (the issue's acceptance; in practice it is within 0.1), and a workload
whose prompts differ at their first tokens must read a flat curve.
"""

from __future__ import annotations

from prefixwatch.simulator import poolcheck

COUNT = 200


def test_the_1x_runs_what_if_is_each_larger_runs_delivered_hit_ratio() -> None:
    base, larger = poolcheck.compare("working-set", 500, ("1.25", "1.5", "2", "4"), COUNT)
    print("\n".join(poolcheck.table("working-set", base, larger)))
    for scale, got in larger.items():
        assert abs(base.whatif_ratio(scale) - got.ratio) <= 0.03, (scale, base, got)
    # A real curve: the pool is what holds this workload back.
    assert larger["2"].ratio - base.ratio > 0.15
    assert base.whatif_ratio("1.25") <= base.whatif_ratio("1.5") <= base.whatif_ratio("2") \
        <= base.whatif_ratio("4")


def test_a_timestamp_at_the_top_reads_a_flat_curve() -> None:
    base, larger = poolcheck.compare("timestamp-at-top", 500, ("2",), COUNT)
    assert base.whatif_ratio("2") - base.ratio < 0.02
    assert abs(base.whatif_ratio("2") - larger["2"].ratio) <= 0.03
