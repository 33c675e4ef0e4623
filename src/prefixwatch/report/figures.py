"""The report's figures, drawn with matplotlib's object API (Agg, no pyplot state, no display).

Each figure is 1280 px wide at 100 dpi, so it is readable as is in a 1280-pixel window, and is
returned as PNG bytes and SVG text.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import matplotlib

matplotlib.use("Agg")

from matplotlib import dates as mdates  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import PercentFormatter  # noqa: E402

from prefixwatch.report.model import ReportData  # noqa: E402

WIDTH_IN, HEIGHT_IN, DPI = 12.8, 5.6, 100
SEVERITY_COLOURS = {"critical": "#d62728", "warning": "#ff7f0e"}
TIER_COLOURS = {"device": "#2ca02c", "host": "#17becf", "disk": "#9467bd", "remote": "#8c564b",
                "unknown": "#7f7f7f", "recomputed": "#d62728"}
LEDGER_COLOURS = {"achieved": "#2ca02c", "novel": "#c7c7c7", "layout": "#d62728",
                  "routing": "#ff7f0e", "eviction": "#9467bd", "unexplained": "#7f7f7f"}
LEDGER_LABELS = {"achieved": "served from cache", "novel": "novel content",
                 "layout": "prompt layout (fixable)", "routing": "routing",
                 "eviction": "eviction", "unexplained": "unexplained"}


@dataclass(frozen=True)
class Drawn:
    """One figure, ready to write or inline."""

    name: str  # file stem: figure1-hit-ratio-ttft
    title: str
    png: bytes
    svg: str


def _dt(ts: Sequence[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, UTC) for t in ts]


def _new(title: str) -> tuple[Figure, object]:
    fig = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # a renderer to measure the legend with
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=15, loc="left", pad=12)
    ax.grid(True, color="#e6e6e6", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.spines["top"].set_visible(False)
    ax.tick_params(labelsize=11)
    return fig, ax


def _time_axis(ax, data: ReportData) -> None:
    ax.set_xlim(*_dt([data.start, data.end]))
    locator = mdates.AutoDateLocator(minticks=5, maxticks=10)
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S" if data.end - data.start < 1800
                                                      else "%H:%M"))
    ax.set_xlabel("time (UTC)", fontsize=12)


def _shade_alerts(ax, data: ReportData) -> list:
    """Alert firing intervals as shaded spans, one legend entry per severity."""
    handles, seen = [], set()
    for alert in data.alerts:
        colour = SEVERITY_COLOURS.get(alert.severity, "#bcbd22")
        end = alert.interval.end if not alert.interval.open else data.end
        span = ax.axvspan(*_dt([alert.interval.start, max(end, alert.interval.start + data.step)]),
                          color=colour, alpha=0.13, linewidth=0)
        key = (alert.name, alert.severity)
        if key not in seen:
            seen.add(key)
            span.set_label(f"{alert.name} firing ({alert.severity or 'no severity'})")
            handles.append(span)
    return handles


def _export(fig: Figure, name: str, title: str) -> Drawn:
    png, svg = io.BytesIO(), io.StringIO()
    fig.savefig(png, format="png", dpi=DPI, metadata={"Software": None})
    with matplotlib.rc_context({"svg.hashsalt": name, "svg.fonttype": "none"}):
        fig.savefig(svg, format="svg", metadata={"Date": None, "Creator": None})
    return Drawn(name, title, png.getvalue(), svg.getvalue())


def _legend(fig: Figure, handles: list | None = None) -> None:
    """The legend under the axes, in as many columns as fit the figure's width (never cut)."""
    handles = handles if handles is not None else [
        h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]]
    renderer = fig.canvas.get_renderer()
    for ncols in range(min(6, len(handles)), 0, -1):
        legend = fig.legend(handles=handles, loc="outside lower center", ncols=ncols,
                            fontsize=11, frameon=False)
        if ncols == 1 or legend.get_window_extent(renderer).width <= 0.96 * fig.bbox.width:
            return
        legend.remove()


def figure1(data: ReportData) -> Drawn:
    """The ratio that pages (fleet, per replica) with the device ratio beside it, against the
    threshold that pages, and TTFT p50/p95 on a second axis; alerts shaded."""
    title = f"Prefix-cache {data.ratio_label} and time to first token: {data.model}"
    fig, ax = _new(title)
    handles = _shade_alerts(ax, data)
    palette = ["#6baed6", "#74c476", "#9e9ac8", "#fdae6b", "#a1d99b", "#bcbddc"]
    for i, (target, samples) in enumerate(data.replicas.items()):
        if len(data.replicas) > 1 and samples:
            ts, vs = zip(*samples, strict=True)
            (line,) = ax.plot(_dt(ts), vs, color=palette[i % len(palette)], linewidth=1.3,
                              label=f"replica {target} (over {data.replica_window_name})"
                              if i < 8 else None)
            if i < 8:
                handles.append(line)
    if data.device:
        ts, vs = zip(*data.device, strict=True)
        (line,) = ax.plot(_dt(ts), vs, color="#6a51a3", linewidth=1.4, linestyle=(0, (2, 2)),
                          label=f"device hit ratio, fleet (over {data.window_name}; does not "
                                "page)")
        handles.insert(0, line)
    if data.fleet:
        ts, vs = zip(*data.fleet, strict=True)
        (line,) = ax.plot(_dt(ts), vs, color="#08519c", linewidth=2.8,
                          label=f"{data.ratio_label}, fleet (over {data.window_name})")
        handles.insert(0, line)
    threshold = ax.axhline(data.threshold, color="#d62728", linestyle=(0, (6, 3)),
                           linewidth=1.4, label=f"alert threshold {data.threshold:.0%}")
    handles.append(threshold)
    ax.set_ylim(0, 1.02)
    ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    ax.set_ylabel(f"{data.ratio_label} (cached / prompt tokens)", fontsize=12)
    _time_axis(ax, data)
    if data.ttft:
        ax2 = ax.twinx()
        ax2.spines["top"].set_visible(False)
        styles = {0.5: ("#7f2704", "-", 2.0), 0.95: ("#f16913", (0, (4, 2)), 1.8)}
        top = max((v for s in data.ttft.values() for _, v in s), default=0.0)
        scale, unit = (1000.0, "ms") if top < 1 else (1.0, "seconds")
        top *= scale
        for q, samples in data.ttft.items():
            if not samples:
                continue
            ts, vs = zip(*((t, v * scale) for t, v in samples), strict=True)
            colour, style, width = styles.get(q, ("#8c6d31", ":", 1.5))
            (line,) = ax2.plot(_dt(ts), vs, color=colour, linestyle=style, linewidth=width,
                               label=f"TTFT p{q * 100:g}")
            handles.append(line)
        ax2.set_ylim(0, top * 1.15 if top > 0 else 1)
        ax2.set_ylabel(f"time to first token ({unit})", fontsize=12)
        ax2.tick_params(labelsize=11)
    else:
        ax.text(0.99, 0.02, "TTFT: not available (no TTFT histogram in range)",
                transform=ax.transAxes, ha="right", fontsize=10, color="#555555")
    _legend(fig, handles)
    return _export(fig, "figure1-hit-ratio-ttft", title)


def _stacked(data: ReportData, name: str, title: str,
             series: dict[str, list[tuple[float, float]]], order: Sequence[str],
             colours: dict[str, str], labels: dict[str, str], shares: bool) -> Drawn | None:
    """``series`` stacked in ``order`` over the range, alerts shaded: as shares of prompt
    tokens against the threshold, or as tokens per second. None without samples."""
    times = sorted({t for samples in series.values() for t, _ in samples})
    if not times:
        return None
    fig, ax = _new(title)
    _shade_alerts(ax, data)
    keys = [k for k in order if k in series]
    stacks = [[dict(series[k]).get(t, 0.0) for t in times] for k in keys]
    ax.stackplot(_dt(times), stacks, labels=[labels.get(k, k) for k in keys],
                 colors=[colours.get(k, "#999999") for k in keys], alpha=0.85, linewidth=0)
    if shares:
        ax.axhline(data.threshold, color="#d62728", linestyle=(0, (6, 3)), linewidth=1.2)
        ax.set_ylim(0, 1.0)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
        ax.set_ylabel("share of prompt tokens", fontsize=12)
    else:
        ax.set_ylabel(f"prompt tokens per second (over {data.window_name})", fontsize=12)
        ax.set_ylim(bottom=0)
    _time_axis(ax, data)
    _legend(fig)
    return _export(fig, name, title)


def figure2(data: ReportData) -> Drawn | None:
    """Prompt tokens per second by the cache tier that served them, and recomputed."""
    if not data.tiers:
        return None
    order = [*(t for t in data.tiers if t != "recomputed"), "recomputed"]
    labels = {t: f"served from {t}" for t in order} | {"recomputed": "recomputed (prefill)"}
    return _stacked(data, "figure2-tiers",
                    f"Prompt tokens by cache tier and recomputed: {data.model}",
                    data.tiers, order, TIER_COLOURS, labels, shares=False)


def figure3(data: ReportData) -> Drawn | None:
    """Where the missed prompt tokens go: the ledger's parts as shares over time."""
    if not data.ledger:
        return None
    return _stacked(data, "figure3-ledger",
                    f"Where the prompt tokens go (the hit-rate ledger): {data.model}",
                    stackable_shares(data.ledger), list(LEDGER_COLOURS), LEDGER_COLOURS,
                    LEDGER_LABELS, shares=True)


def stackable_shares(ledger: dict[str, list[tuple[float, float]]]
                     ) -> dict[str, list[tuple[float, float]]]:
    """The ledger's shares made stackable: a negative part (a signed unexplained rest, the
    tails of a window's edges) cannot be drawn, so it is left out and the others are scaled
    to what they sum to when that passes 100%: the stack never claims more than the prompt
    tokens."""
    drawn = {k: v for k, v in ledger.items() if k in LEDGER_COLOURS}
    totals: dict[float, float] = {}
    for samples in drawn.values():
        for t, v in samples:
            totals[t] = totals.get(t, 0.0) + max(v, 0.0)
    return {k: [(t, max(v, 0.0) / max(1.0, totals[t])) for t, v in s] for k, s in drawn.items()}
