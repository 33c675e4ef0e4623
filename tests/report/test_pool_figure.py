"""The report's pool curve (report/poolfigure.py) from a recorded curve, without Prometheus."""

from __future__ import annotations

from prefixwatch.report.model import ReportData
from prefixwatch.report.poolfigure import curve_words, figure4, missing
from prefixwatch.report.render import not_available
from prefixwatch.report.timeline import Crossings


def data(curve: dict[str, float] | None, ledger=None) -> ReportData:
    return ReportData(prometheus="http://127.0.0.1:9", model="llama", models=["llama"],
                      start=0.0, end=600.0, step=15.0, window=120.0, threshold=0.7, fleet=[],
                      device=[], replicas={}, ttft={}, alerts=[], diagnosis={},
                      crossings=Crossings(None, None), phases=[], tiers=None, ledger=ledger,
                      pool_curve=curve, pool_curve_span="during the drop")


def test_an_eviction_incident_draws_its_curve_and_says_how_much_memory() -> None:
    d = data({"1": 0.62, "1.25": 0.72, "1.5": 0.81, "2": 0.84, "4": 0.85})
    _curve, words = curve_words(d)
    assert words == ("with 1.5x the KV pool the hit ratio would have been 81% instead of 62% "
                     "(1.25x: 72%, 2x: 84%, 4x: 85%)")
    drawn = figure4(d)
    assert drawn is not None and drawn.name == "figure4-pool-curve"
    assert words in drawn.title and drawn.png.startswith(b"\x89PNG") and "<svg" in drawn.svg


def test_a_layout_incident_says_memory_would_not_help() -> None:
    ledger = {"layout": [(0.0, 0.8), (15.0, 0.8)], "novel": [(0.0, 0.1)],
              "achieved": [(0.0, 0.03)]}
    d = data({"1": 0.03, "1.25": 0.03, "1.5": 0.035, "2": 0.04, "4": 0.04}, ledger)
    assert curve_words(d)[1] == ("more memory would not help: 2x the pool gains 1 point; the "
                                 "missed tokens are layout (a prompt-layout fix would share "
                                 "them)")


def test_without_a_recorded_curve_the_report_says_why() -> None:
    d = data(None)
    assert figure4(d) is None
    assert not_available("figure4-pool-curve", d) == missing()
    assert "model_name_pool_scale:kv_whatif_hit_ratio:ratio_rate5m" in missing()
