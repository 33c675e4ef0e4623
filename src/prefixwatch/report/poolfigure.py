"""The report's pool curve: the hit ratio each larger KV pool would have given over the
incident (or the whole range), today's point marked, titled with the sentence that reads it.

Self-contained: ``pool_curve`` reads the recorded curve from Prometheus
(``model_name_pool_scale:kv_whatif_hit_ratio:ratio_rate5m``, the exporter's KV event streams),
``figure4`` draws it, ``missing`` says why it is not there.
"""

from __future__ import annotations

from prefixwatch.core.kv.poolcurve import PoolCurve, verdict
from prefixwatch.core.vocab.exposition import KV_WHATIF_POOL_SCALES, L_POOL_SCALE
from prefixwatch.core.vocab.rulenames import POOL_SCALE_TODAY, REPLICA_WINDOW, r_kv_whatif_ratio
from prefixwatch.report.model import ReportData
from prefixwatch.report.promapi import PromClient

NAME = "figure4-pool-curve"
RECORDED = r_kv_whatif_ratio(REPLICA_WINDOW)


def pool_curve(client: PromClient, selector: str, start: float, end: float,
               step: float) -> dict[str, float] | None:
    """The mean of each pool_scale's recorded ratio (``selector``: one model's) over
    ``start``-``end``; None when the curve is not recorded there."""
    span = max(int(end - start), int(step), 1)
    found = client.query(f"avg_over_time({RECORDED}{selector}[{span}s])", end)
    out = {s.labels.get(L_POOL_SCALE, ""): s.samples[0][1] for s in found if s.samples}
    if POOL_SCALE_TODAY not in out or not any(s in out for s in KV_WHATIF_POOL_SCALES):
        return None
    return out


def curve_words(data: ReportData) -> tuple[PoolCurve, str] | None:
    """The report's curve and its sentence (the ledger's mean shares name the missed tokens
    when memory would not help)."""
    got = data.pool_curve
    if not got:
        return None
    curve = PoolCurve(0, got[POOL_SCALE_TODAY],
                      {s: got[s] for s in KV_WHATIF_POOL_SCALES if s in got})
    parts = None
    if data.ledger:
        parts = {p: sum(v for _, v in s) / len(s) for p, s in data.ledger.items() if s}
    return curve, verdict(curve, parts)


def figure4(data: ReportData):
    """The hit ratio against the KV pool size (a multiple of today's), or None."""
    from prefixwatch.report.figures import _export, _new

    got = curve_words(data)
    if got is None:
        return None
    curve, words = got
    title = f"Hit ratio by KV pool size ({data.pool_curve_span}): {data.model}: {words}"
    fig, ax = _new(f"Hit ratio by KV pool size: {data.model}")
    xs, ys = zip(*curve.points(), strict=True)
    ax.plot(xs, ys, color="#1f77b4", linewidth=2, marker="o")
    ax.plot([1.0], [curve.today], marker="o", markersize=10, color="#d62728", linestyle="")
    ax.annotate(f"today {curve.today:.0%}", (1.0, curve.today), textcoords="offset points",
                xytext=(10, -16), color="#d62728")
    ax.axhline(data.threshold, color="#d62728", linestyle=(0, (6, 3)), linewidth=1.0)
    ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:g}x" for x in xs])
    ax.minorticks_off()
    ax.set_ylim(0, 1.05)
    from matplotlib.ticker import PercentFormatter

    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_xlabel("KV pool, as a multiple of today's", fontsize=12)
    ax.set_ylabel("hit ratio", fontsize=12)
    ax.text(0.01, 0.02, words, transform=ax.transAxes, fontsize=11, color="#333333")
    return _export(fig, NAME, title)


def missing() -> str:
    """Why figure 4 is not there."""
    return (f"Figure 4 (hit ratio by KV pool size): not available: no {RECORDED} series in "
            "this range (the exporter writes the pool what-if when it follows a target's KV "
            "event stream and knows its pool size).")
