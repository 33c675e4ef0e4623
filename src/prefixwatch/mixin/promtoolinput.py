"""promtool test input: traffic phases as counter series in promtool's notation, and alert
annotations rendered as Prometheus renders the few template constructs ours use."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

STEP = 15  # seconds between samples and rule evaluations
MODEL = "llama-3-8b"


@dataclass
class Phase:
    """Traffic for a while: prompt tokens per second and the share served from cache."""

    minutes: float
    tokens_per_s: float
    hit_ratio: float  # the device pool's share of the prompt tokens
    reset: bool = False  # the server restarted at the start of this phase
    #: Share of the prompt tokens a host tier served (None: no second tier configured).
    host: float | None = None


def counters(phases: Sequence[Phase]) -> tuple[list[float], list[float], list[float]]:
    """Cumulative queries, device hits and host hits, one sample per STEP, with restarts as
    counter resets."""
    q = h = x = 0.0
    qs, hs, xs = [0.0], [0.0], [0.0]
    for phase in phases:
        if phase.reset:
            q = h = x = 0.0
            qs[-1], hs[-1], xs[-1] = q, h, x
        for _ in range(round(phase.minutes * 60 / STEP)):
            q += phase.tokens_per_s * STEP
            h += phase.tokens_per_s * STEP * phase.hit_ratio
            x += phase.tokens_per_s * STEP * (phase.host or 0.0)
            qs.append(q)
            hs.append(h)
            xs.append(x)
    return qs, hs, xs


def sample(expr: str, at: str, labels: str, value: float) -> dict[str, Any]:
    """A promql_expr_test: ``expr`` evaluated at ``at`` is one sample, ``labels`` ``value``."""
    return {"expr": expr, "eval_time": at, "exp_samples": [{"labels": labels, "value": value}]}


def compress(values: Sequence[float | None]) -> str:
    """promtool's expanding notation: runs of equal steps become 'a+bxN'."""
    out: list[str] = []
    i = 0
    n = len(values)

    def fmt(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else repr(round(v, 6))

    while i < n:
        v = values[i]
        if v is None:
            out.append("_")
            i += 1
            continue
        j = i + 1
        if j < n and values[j] is not None:
            step = values[j] - v  # type: ignore[operator]
            while j + 1 < n and values[j + 1] is not None and abs(
                    (values[j + 1] - values[j]) - step) < 1e-9:  # type: ignore[operator]
                j += 1
            if j - i >= 2:
                sign = "+" if step >= 0 else "-"
                out.append(f"{fmt(v)}{sign}{fmt(abs(step))}x{j - i}")
                i = j + 1
                continue
        out.append(fmt(v))
        i += 1
    return " ".join(out)


def humanize_percentage(value: float) -> str:
    return f"{value * 100:.4g}%"


_EQ_CHAIN = re.compile(r'\{\{ if eq \$labels\.(\w+) "(.*?)" \}\}(.*?)'
                       r'((?:\{\{ else if eq \$labels\.\w+ ".*?" \}\}.*?)*)'
                       r"\{\{ else \}\}(.*?)\{\{ end \}\}")
_ELSE_IF = re.compile(r'\{\{ else if eq \$labels\.(\w+) "(.*?)" \}\}(.*?)(?=\{\{ else |$)')


_PERCENT_OF = re.compile(r'\{\{ with query \(printf "100 \* .*?\) \}\}'
                        r'\{\{ \. \| first \| value \| printf "%\.1f%%" \}\}\{\{ end \}\}')


def render_annotation(template: str, labels: dict[str, str], value: float) -> str:
    """The few template constructs our annotations use, rendered as Prometheus would."""
    text = template.replace("{{ $value | humanizePercentage }}", humanize_percentage(value))
    text = text.replace("{{ $value }}", f"{value:g}")  # Go's %v of a float64, for counts
    # The alerted series queried times 100 and printed to one decimal (Alerts.percent_of):
    # the alert's value itself.
    text = _PERCENT_OF.sub(lambda _m: f"{value * 100:.1f}%", text)

    def chain(match: re.Match[str]) -> str:
        branches = [(match.group(1), match.group(2), match.group(3))]
        branches += _ELSE_IF.findall(match.group(4))
        for label, wanted, body in branches:
            if labels.get(label) == wanted:
                return body
        return match.group(5)

    text = _EQ_CHAIN.sub(chain, text)

    def cond(match: re.Match[str]) -> str:
        return match.group(2) if labels.get(match.group(1)) else ""

    text = re.sub(r"\{\{ if \$labels\.(\w+) \}\}(.*?)\{\{ end \}\}", cond, text)
    return re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
