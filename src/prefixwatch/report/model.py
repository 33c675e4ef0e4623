"""What a report is about and what it found: the request, the recorded series it reads, and
the fetched figures (report/collect.py fills them, figures.py and render.py show them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixwatch.core.story import root_causes, window_words
from prefixwatch.core.vocab import settings
from prefixwatch.core.vocab.rulenames import (
    MODEL,
    MODEL_TARGET,
    REPLICA_WINDOW,
    r_cached,
    r_effective,
    r_hits,
    r_prompt,
    r_queries,
    r_ratio,
)
from prefixwatch.report.timeline import AlertFiring, Crossings, Interval, Phase

TTFT_QUANTILES = (0.5, 0.95)


@dataclass(frozen=True)
class Recorded:
    """The recorded series of one ratio: the ratio itself and its numerator and denominator
    rates, fleet-wide per model and per replica."""

    ratio: str
    num: str
    den: str
    replica_num: str
    replica_den: str


def recorded(mode: str, window: str) -> Recorded:
    """The series of the effective or the device ratio over ``window``."""
    if mode == settings.HIT_RATIO_EFFECTIVE:
        return Recorded(r_effective(MODEL, window), r_cached(MODEL, window),
                        r_prompt(MODEL, window), r_cached(MODEL_TARGET, REPLICA_WINDOW),
                        r_prompt(MODEL_TARGET, REPLICA_WINDOW))
    return Recorded(r_ratio(MODEL, window), r_hits(MODEL, window), r_queries(MODEL, window),
                    r_hits(MODEL_TARGET, REPLICA_WINDOW), r_queries(MODEL_TARGET, REPLICA_WINDOW))


@dataclass(frozen=True)
class Request:
    """What to report on."""

    start: float
    end: float
    threshold: float
    model: str | None = None
    #: The recorded ratio window the report reads: the critical alert's short window.
    ratio_window: str = settings.CRITICAL_SHORT_WINDOW
    #: The rules' time scale (MixinConfig.time_scale): the window spans its name times this.
    time_scale: float = 1.0
    #: Which ratio pages: effective (every cache tier) or device.
    hit_ratio: str = settings.DEFAULT_HIT_RATIO_MODE
    prefill_tokens_per_second: float | None = None
    price_per_million_tokens: float | None = None


@dataclass
class PhaseStats:
    phase: Phase
    hit_ratio: float | None
    effective_ratio: float | None
    #: The paging ratio per replica (over REPLICA_WINDOW rates).
    per_replica: dict[str, float | None]
    ttft: dict[float, float | None]
    queries: float
    hits: float
    #: The ratio that pages (effective or device).
    judged: float | None = None


@dataclass
class ReportData:
    """The fetched and derived figures, ready to draw and write."""

    prometheus: str
    model: str
    models: list[str]
    start: float
    end: float
    step: float
    window: float
    threshold: float
    #: The paging ratio of the fleet, and the device ratio beside it when the effective pages.
    fleet: list[tuple[float, float]]
    device: list[tuple[float, float]]
    replicas: dict[str, list[tuple[float, float]]]
    ttft: dict[float, list[tuple[float, float]]]
    alerts: list[AlertFiring]
    diagnosis: dict[str, list[tuple[str, Interval]]]
    crossings: Crossings
    phases: list[PhaseStats]
    #: tier -> tokens/s served from it, and "recomputed"; None when no tier series exist.
    tiers: dict[str, list[tuple[float, float]]] | None
    #: ledger part -> share of prompt tokens over time; None when the ledger is not recorded.
    ledger: dict[str, list[tuple[float, float]]] | None
    hit_ratio: str = settings.DEFAULT_HIT_RATIO_MODE
    ratio_window: str = settings.CRITICAL_SHORT_WINDOW
    incident: Interval | None = None
    extra_recomputed_tokens: float | None = None
    gpu_seconds: float | None = None
    cost: float | None = None
    #: One line saying why the cost (or the phase table) is empty, when it is.
    cost_note: str = ""
    phase_note: str = ""
    notes: list[str] = field(default_factory=list)
    divergence: dict | None = None
    #: The pool what-if curve (pool_scale -> hit ratio, "1" today) over ``pool_curve_span``;
    #: None when not recorded (report/poolfigure.py).
    pool_curve: dict[str, float] | None = None
    pool_curve_span: str = ""
    #: The model's ladder at the end of the range (core/kv/ladder.py): its window, and each
    #: rung's hit ratio, as text lines; None when the exporter wrote none.
    ladder: tuple[str, list[str]] | None = None
    #: The per-replica ratio's window, in seconds (REPLICA_WINDOW under the time scale).
    replica_window: float = 0.0
    #: What varied early in the prompts during the incident, in words (the exporter's
    #: culprit series); None when none was recorded.
    culprit: str | None = None

    @property
    def window_name(self) -> str:
        """The paging ratio's window by its length ('6s' under the demo's time scale)."""
        return window_words(self.window)

    @property
    def replica_window_name(self) -> str:
        return window_words(self.replica_window or self.window)

    @property
    def root_causes(self) -> list[str]:
        """The causes that held when the ratio dropped or after (core/story.py)."""
        spans = {cause: [(iv.start, None if iv.open else iv.end) for _t, iv in held]
                 for cause, held in self.diagnosis.items()}
        return root_causes(spans, self.crossings.first_drop)

    @property
    def ratio_label(self) -> str:
        """How the texts name the paging ratio."""
        return ("effective hit ratio" if self.hit_ratio == settings.HIT_RATIO_EFFECTIVE
                else "device hit ratio")

    def phase(self, name: str) -> PhaseStats | None:
        return next((p for p in self.phases if p.phase.name == name), None)
