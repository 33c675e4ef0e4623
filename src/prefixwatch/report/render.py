"""report.html (one self-contained file) and report.md (a postmortem skeleton), via jinja2.

Both are rendered from the same rows (timeline, phase tables, diagnosis), so the ticket and
the page never disagree. The HTML inlines every figure as a base64 PNG: it opens offline.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import UTC, datetime

import jinja2

from prefixwatch.core.story import headline, percent
from prefixwatch.core.version import __version__
from prefixwatch.core.vocab.rulenames import MODEL_TIER, R_LEDGER_SHARE, r_cached
from prefixwatch.report.divergence import Finding
from prefixwatch.report.figures import Drawn
from prefixwatch.report.model import TTFT_QUANTILES, ReportData


def not_available(name: str, data: ReportData) -> str:
    """Why a figure is missing, naming the recorded series it reads."""
    if name == "figure2-tiers":
        return ("Figure 2 (prompt tokens by cache tier and recomputed): not available: no "
                f"{r_cached(MODEL_TIER, data.ratio_window)} series in this range (an "
                "exporter or engine with cache-tier counters feeds it).")
    if name == "figure3-ledger":
        return (f"Figure 3 (where the misses go): not available: no {R_LEDGER_SHARE} series "
                "in this range (the exporter writes the ledger when it follows a request log).")
    if name == "figure4-pool-curve":
        from prefixwatch.report.poolfigure import missing

        return missing()
    return ""


def when(t: float | None, with_date: bool = False) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).strftime(
        "%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")


def pct(value: float | None) -> str:
    return percent(value)


def secs(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def tokens(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return f"{value:.0f}"


@dataclass(frozen=True)
class Event:
    at: float
    what: str


def timeline(data: ReportData) -> list[Event]:
    events: list[Event] = []
    cross = data.crossings
    ratio = f"fleet {data.ratio_label} (over {data.window_name})"
    if cross.first_drop is not None:
        value = dict(data.fleet).get(cross.first_drop)
        prefix = f"{ratio} already below" if cross.low_at_start else f"{ratio} first below"
        events.append(Event(cross.first_drop, f"{prefix} the {data.threshold:.0%} threshold "
                                              f"({pct(value)})"))
    for alert in data.alerts:
        scope = f" on {where}" if (where := alert.labels.get("target")) else ""
        pending = (f", pending since {when(alert.active_since)}"
                   if alert.active_since and alert.active_since < alert.interval.start else "")
        events.append(Event(alert.interval.start, f"{alert.name} ({alert.severity}) "
                                                  f"firing{scope}{pending}"))
        if not alert.interval.open:
            events.append(Event(alert.interval.end, f"{alert.name} resolved{scope} "
                                                    "(last firing evaluation)"))
    if cross.recovery is not None:
        value = dict(data.fleet).get(cross.recovery)
        events.append(Event(cross.recovery, f"{ratio} back above the threshold "
                                            f"({pct(value)}): recovered"))
    elif cross.first_drop is not None:
        events.append(Event(data.end, "end of range: not recovered"))
    return sorted(events, key=lambda e: e.at)


def phase_rows(data: ReportData) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the before/during/after table."""
    if not data.phases:
        return [], []
    header = ["", *(f"{p.phase.name} ({when(p.phase.start)}-{when(p.phase.end)})"
                    for p in data.phases)]
    over = f" (over {data.window_name})"
    rows = [["device hit ratio, fleet" + over, *(pct(p.hit_ratio) for p in data.phases)]]
    if any(p.effective_ratio is not None for p in data.phases):
        rows.append(["effective hit ratio, fleet (all tiers)" + over,
                     *(pct(p.effective_ratio) for p in data.phases)])
    for target in sorted({t for p in data.phases for t in p.per_replica}):
        rows.append([f"{data.ratio_label}, replica {target} (over {data.replica_window_name})",
                     *(pct(p.per_replica.get(target)) for p in data.phases)])
    for q in TTFT_QUANTILES:
        rows.append([f"TTFT p{q * 100:g}", *(secs(p.ttft.get(q)) for p in data.phases)])
    rows.append(["prompt tokens looked up", *(tokens(p.queries) for p in data.phases)])
    return header, rows


def diagnosis_rows(data: ReportData) -> list[list[str]]:
    return [[cause, target, when(iv.start), "still holds" if iv.open else when(iv.end)]
            for cause, spans in data.diagnosis.items() for target, iv in spans]


_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>prefixwatch incident report: {{ d.model }}</title>
<style>
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
max-width:1300px;padding:0 12px;color:#1a1a1a;line-height:1.45}
h1{font-size:26px;margin-bottom:4px} h2{font-size:20px;margin-top:32px;border-bottom:1px solid
#ddd;padding-bottom:4px} .meta{color:#555} table{border-collapse:collapse;margin:8px 0}
td,th{border:1px solid #ddd;padding:4px 10px;text-align:left;font-variant-numeric:tabular-nums}
th{background:#f4f4f4} figure{margin:16px 0} figure img{width:100%;max-width:1280px;height:auto;
border:1px solid #eee} figcaption{color:#444;font-size:14px} .na{background:#f8f8f8;
border:1px dashed #bbb;padding:12px;color:#555} code,pre{background:#f4f4f4;padding:1px 4px}
pre{padding:8px;white-space:pre-wrap}
</style></head><body>
<h1>Prefix-cache incident report: {{ d.model }}</h1>
<p class="meta">{{ when(d.start, True) }} to {{ when(d.end, True) }} UTC · Prometheus
{{ d.prometheus }} · alert threshold {{ '%.0f%%' % (d.threshold * 100) }} on the fleet
{{ d.ratio_label }} over {{ d.window_name }} (the recorded {{ d.ratio_window }} series)
· prefixwatch {{ version }}</p>
{% for note in d.notes %}<p class="meta">{{ note }}</p>{% endfor %}
<h2>Summary</h2>
<p class="story">{{ story }}</p>
<ul><li>Impact: {{ impact }}</li><li>Detection: {{ detection }}</li>
<li>Root cause: {{ root_cause }}</li><li>Resolution: <i>(fill in)</i></li></ul>
<h2>Figures</h2>
{% for f in figures %}{% if f.drawn %}
<figure><img class="report-figure" alt="{{ f.drawn.title }}"
src="data:image/png;base64,{{ f.b64 }}"><figcaption>{{ f.caption }}</figcaption></figure>
{% else %}<p class="na">{{ f.caption }}</p>{% endif %}{% endfor %}
<h2>Timeline (UTC)</h2>
{% if events %}<table><tr><th>time</th><th>event</th></tr>
{% for e in events %}<tr><td>{{ when(e.at, True) }}</td><td>{{ e.what }}</td></tr>{% endfor %}
</table>{% else %}<p>The fleet {{ d.ratio_label }} stayed above the threshold and no prefixwatch
alert fired in this range.</p>{% endif %}
<h2>Hit rate and TTFT before, during and after</h2>
{% if header %}<table><tr>{% for h in header %}<th>{{ h }}</th>{% endfor %}</tr>
{% for row in rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}
</table>
<p class="meta">Each phase leaves out the {{ '%.0f' % d.window }}s rate window around a transition,
where healthy and incident traffic mix.</p>{% else %}<p>{{ d.phase_note }}</p>{% endif %}
<h2>Cost</h2><p>{{ cost }}</p>
<h2>Diagnosis over time (prefixwatch_diagnosis)</h2>
{% if diag %}<table><tr><th>cause</th><th>target</th><th>from</th><th>to</th></tr>
{% for r in diag %}<tr>{% for c in r %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}</table>
{% else %}<p>No cause held in this range (or the exporter's diagnosis was not scraped).</p>
{% endif %}
{% if div %}<h2>Request log: where prompts stop sharing a prefix</h2>
<p>{{ div.count }} of {{ div.requests }} requests first differ from the closest earlier request at
token {{ div.position }} ({{ div.kind }}); an unlimited cache could serve
{{ pct(div.achievable) }} of their prompt tokens.</p><pre>{{ div.context }}</pre>
<p><b>Fix:</b> {{ div.fix }}</p>{% endif %}
{% if d.ladder %}<h2>The ladder ({{ d.ladder[0] }} to the end of the range)</h2>
<p>The hit ratio as delivered, then with each fix the KV event ledger names added
(docs/routers.md#the-ladder):</p><pre>{{ d.ladder[1] | join("\n") }}</pre>{% endif %}
</body></html>
"""

_MD = """# Incident report: prefix-cache hit rate of {{ d.model }}

- Range: {{ when(d.start, True) }} to {{ when(d.end, True) }} UTC
- Source: Prometheus {{ d.prometheus }}; alert threshold {{ '%.0f%%' % (d.threshold * 100) }} \
on the fleet {{ d.ratio_label }} over {{ d.window_name }} (the recorded {{ d.ratio_window }} series)
{% for note in d.notes %}- {{ note }}
{% endfor %}
## Summary

{{ story }}

- Impact: {{ impact }}
- Detection: {{ detection }}
- Root cause: {{ root_cause }}
- Resolution: _(fill in)_

## Timeline (UTC)

| time | event |
| --- | --- |
{% for e in events %}| {{ when(e.at, True) }} | {{ e.what | md }} |
{% endfor %}{% if not events %}| - | the hit ratio stayed above the threshold; no alert fired |
{% endif %}
## Hit rate and TTFT before, during and after

{% if header %}| {% for h in header %}{{ h | md }} | {% endfor %}
|{% for h in header %} --- |{% endfor %}
{% for row in rows %}| {% for c in row %}{{ c | md }} | {% endfor %}
{% endfor %}
Each phase leaves out the {{ '%.0f' % d.window }}s rate window around a transition.
{% else %}{{ d.phase_note }}
{% endif %}
## Cost

{{ cost }}

## Diagnosis over time (prefixwatch_diagnosis)

{% if diag %}| cause | target | from | to |
| --- | --- | --- | --- |
{% for r in diag %}| {% for c in r %}{{ c | md }} | {% endfor %}
{% endfor %}{% else %}No cause held in this range.
{% endif %}
{% if div %}## Request log: first divergent token

{{ div.count }} of {{ div.requests }} requests first differ from the closest earlier request at \
token {{ div.position }} ({{ div.kind }}); achievable hit ratio {{ pct(div.achievable) }}.

```
{{ div.context }}
```

Fix: {{ div.fix }}

{% endif %}{% if d.ladder %}## The ladder ({{ d.ladder[0] }} to the end of the range)

The hit ratio as delivered, then with each fix the KV event ledger names added
(docs/routers.md#the-ladder):

```
{{ d.ladder[1] | join("\n") }}
```

{% endif %}## Figures

{% for f in figures %}{% if f.drawn %}![{{ f.drawn.title }}]({{ f.drawn.name }}.png)
{% else %}{{ f.caption }}
{% endif %}
{% endfor %}## Action items

- [ ] _(fill in)_
"""


def _md_cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _environment(autoescape: bool) -> jinja2.Environment:
    env = jinja2.Environment(autoescape=autoescape, undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True)
    env.filters["md"] = _md_cell
    env.globals.update(when=when, pct=pct, secs=secs, version=__version__)
    return env


def _cost(data: ReportData) -> str:
    before = data.phase("before")
    if data.extra_recomputed_tokens is None or data.incident is None or before is None:
        return data.cost_note or "Nothing to attribute."
    text = (f"{tokens(data.extra_recomputed_tokens)} prompt tokens were recomputed because of "
            f"the incident ({when(data.incident.start)}-{when(data.incident.end)} UTC), at "
            f"the healthy {data.ratio_label} of {pct(before.judged)}")
    extra = []
    if data.gpu_seconds is not None:
        extra.append(f"{data.gpu_seconds:,.0f} GPU-seconds of prefill")
    if data.cost is not None:
        extra.append(f"{data.cost:,.2f} in the configured currency")
    return text + (": " + ", ".join(extra) if extra else "") + "."


def _context(data: ReportData, drawn: list[tuple[str, Drawn | None]],
             finding: Finding | None) -> dict:
    during = data.phase("during")
    impact = _impact(data)
    first = next((a for a in data.alerts), None)
    detection = (f"{first.name} ({first.severity}) fired at {when(first.interval.start, True)} "
                 "UTC" if first else "no prefixwatch alert fired in range")
    causes = data.root_causes
    now = during.judged if during is not None else (
        data.fleet[-1][1] if data.fleet else None)
    story = headline(f"fleet {data.ratio_label}", now, data.window_name, causes, data.culprit)
    root = ", ".join(causes) if causes else ""
    if data.culprit:
        root = f"{root}: {data.culprit}" if root else data.culprit
    root_cause = (f"{root} (the exporter's diagnosis; confirm, then fill in)" if root
                  else "_(fill in)_: the exporter diagnosed no cause that held at the drop")
    figures = [{"drawn": fig, "caption": fig.title if fig else not_available(name, data),
                "b64": base64.b64encode(fig.png).decode() if fig else ""} for name, fig in drawn]
    header, rows = phase_rows(data)
    return {"d": data, "events": timeline(data), "header": header, "rows": rows,
            "diag": diagnosis_rows(data), "cost": _cost(data), "figures": figures,
            "impact": impact, "detection": detection, "story": story,
            "root_cause": root_cause, "div": finding}


def _impact(data: ReportData) -> str:
    """Before -> during, in the one precision; or why a side is missing."""
    before, during = data.phase("before"), data.phase("during")
    cross = data.crossings
    if cross.first_drop is None:
        return "no drop below the threshold in this range"
    ratio = f"fleet {data.ratio_label} over {data.window_name}"
    if during is None:
        return (f"{ratio} below the threshold from {when(cross.first_drop)} UTC; the range "
                f"holds no phase longer than the {data.window_name} window to average "
                "(widen it)")
    if before is None:
        return (f"{ratio} {pct(during.judged)} during the incident, already below the "
                "threshold at the start of the range (widen it for a healthy baseline)")
    return (f"{ratio}: {pct(before.judged)} -> {pct(during.judged)}, TTFT p50 "
            f"{secs(before.ttft.get(0.5))} -> {secs(during.ttft.get(0.5))}")


def render_html(data: ReportData, drawn: list[tuple[str, Drawn | None]],
                finding: Finding | None = None) -> str:
    return _environment(True).from_string(_HTML).render(_context(data, drawn, finding))


def render_markdown(data: ReportData, drawn: list[tuple[str, Drawn | None]],
                    finding: Finding | None = None) -> str:
    return _environment(False).from_string(_MD).render(_context(data, drawn, finding))
