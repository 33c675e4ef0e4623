"""When the critical page fires on a list of traffic phases, as promtool evaluates it: the
expectations of the generated cases follow the config (another threshold, other windows)
instead of being copied from one run.

promtool (Prometheus 2) evaluates at every step of 15 s with samples on the same grid: a window
``[t - w, t]`` holds ``w / 15 + 1`` samples, and ``rate(hits) / rate(queries)`` over it is the
hits' increase over the queries' (both extrapolate alike). The alert reads the recording rules'
ratios, evaluated in the same step or, in the other group order, one step earlier; so a page
has an earliest and a latest time, one step apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.mixin.promtoolinput import STEP, Phase, counters


@dataclass(frozen=True)
class PageTimes:
    """Minutes from the start to the first evaluation that fires, in the faster and the
    slower group order (None: never within the phases), and the value the page carries then
    (the short window's ratio at ``latest``)."""

    earliest: float | None
    latest: float | None
    value: float | None = None


def _ratio(qs: list[float], hs: list[float], i: int, steps: int) -> tuple[float, float] | None:
    """(hit ratio, prompt tokens per second) over the window of ``steps`` steps ending at
    sample ``i``; None before the window has two samples or without traffic."""
    j = max(0, i - steps)
    if i - j < 1:
        return None
    dq, dh = qs[i] - qs[j], hs[i] - hs[j]
    if dq <= 0 or dq < qs[i] - qs[i - 1]:  # no traffic, or a counter reset in the window
        return None
    return dh / dq, dq / ((i - j) * STEP)


def _holds(cfg: MixinConfig, qs: list[float], hs: list[float], resets: set[int], i: int
           ) -> bool:
    """The critical expression at sample ``i`` (the short window below the threshold, and
    below the collapse level or with the long window below too; traffic; no recent reset)."""
    thr = cfg.hit_ratio_threshold
    short = _ratio(qs, hs, i, round(parse_duration(cfg.critical_short_window) / STEP))
    long_ = _ratio(qs, hs, i, round(parse_duration(cfg.critical_long_window) / STEP))
    cold = round(parse_duration(cfg.cold_start) / STEP)
    if short is None or short[1] <= cfg.min_query_tokens_per_second:
        return False
    if any(i - cold <= r <= i for r in resets):
        return False
    collapse = short[0] < round(thr * cfg.critical_collapse_share, 6)
    fall = long_ is not None and long_[0] < thr
    return short[0] < thr and (collapse or fall)


def page_times(cfg: MixinConfig, phases: Sequence[Phase], effective: bool = True) -> PageTimes:
    """When PrefixCacheHitRateLow (critical) first fires on these phases (one replica), on the
    effective ratio (a host tier's hits count) or the device pool's."""
    qs, device, host = counters(phases)
    hs = [d + h for d, h in zip(device, host, strict=True)] if effective else device
    resets, at = set(), 0
    for phase in phases:
        if phase.reset:
            resets.add(at)
        at += round(phase.minutes * 60 / STEP)
    hold = round(parse_duration(cfg.critical_for) / STEP)
    run, fired = 0, None
    for i in range(len(qs)):
        run = run + 1 if _holds(cfg, qs, hs, resets, i) else 0
        if run > hold:
            fired = i
            break
    if fired is None or fired + 1 >= len(qs):
        return PageTimes(None, None)
    first = fired * STEP / 60
    short = _ratio(qs, hs, fired + 1, round(parse_duration(cfg.critical_short_window) / STEP))
    return PageTimes(first, first + STEP / 60, None if short is None else round(short[0], 6))
