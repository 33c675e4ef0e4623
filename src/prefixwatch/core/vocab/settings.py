"""The settings the exporter's diagnosis and the mixin's rules share: one parser, one check.

A ``diagnosis:`` section (the thresholds of ``core.causes.DiagnosisThresholds``, its window and
the cold start) reads the same in the exporter's ``--config`` file and in the mixin config, and
the top-level ``hit_ratio_threshold`` and ``cold_start`` of either file are the defaults of its
``hit_ratio`` and ``cold_start``: so the threshold that pages and the threshold that diagnoses
are one number. The top-level ``kv_usage_high`` is the KV-usage level of both, and the
top-level ``hit_ratio: effective|device`` says which ratio both judge: the effective one
(prompt tokens served from any cache tier) or the device pool's alone.
Pure: the exporter cannot import the mixin, so both import this.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab.causes import COLD_START, DIAGNOSIS_WINDOW, DiagnosisThresholds
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.core.yamlfile import suggest

#: Top-level keys both config files accept, feeding the diagnosis' defaults.
THRESHOLD_KEY = "hit_ratio_threshold"
#: Top-level key: the KV-usage level of eviction pressure, for the alert and the diagnosis
#: alike (no diagnosis key of its own).
KV_USAGE_KEY = "kv_usage_high"
COLD_START_KEY = "cold_start"
DIAGNOSIS_KEY = "diagnosis"
#: Top-level key: which hit ratio the threshold judges (alerts and diagnosis alike).
HIT_RATIO_KEY = "hit_ratio"
HIT_RATIO_EFFECTIVE = "effective"
HIT_RATIO_DEVICE = "device"
HIT_RATIO_MODES: tuple[str, ...] = (HIT_RATIO_EFFECTIVE, HIT_RATIO_DEVICE)
DEFAULT_HIT_RATIO_MODE = HIT_RATIO_EFFECTIVE
#: PrefixCacheHitRateLow (critical) scales its confirmation with the depth of the fall: the
#: short window below ``CRITICAL_COLLAPSE_SHARE`` of the threshold (a collapse) pages after
#: ``for`` alone, a shallower fall below the threshold once the long window is below it too.
#: The report plots the short window, the value the page carries.
CRITICAL_SHORT_WINDOW = "1m"
CRITICAL_LONG_WINDOW = "5m"
CRITICAL_FOR = "30s"
CRITICAL_COLLAPSE_SHARE = 0.5
THRESHOLD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(DiagnosisThresholds))
DIAGNOSIS_KEYS = frozenset({"window", "cold_start", *THRESHOLD_FIELDS} - {KV_USAGE_KEY})
#: Thresholds that are shares: in (0, 1].
_SHARES = ("hit_ratio", KV_USAGE_KEY, "short_prompt_share", "routing_gap", "ttft_rise",
           "ttft_fall", "tier_idle_hit_share")


@dataclass(frozen=True)
class DiagnosisSettings:
    """What the exporter's diagnosis needs: its window, the cold start and the thresholds."""

    window: str = DIAGNOSIS_WINDOW
    cold_start: str = COLD_START
    thresholds: DiagnosisThresholds = field(default_factory=DiagnosisThresholds)
    #: Which ratio the hit-ratio threshold judges: ``effective`` (any tier) or ``device``.
    hit_ratio_mode: str = DEFAULT_HIT_RATIO_MODE

    def as_config(self) -> dict[str, Any]:
        """The config-file keys that read back as these settings (every key given)."""
        section = {k: v for k, v in asdict(self.thresholds).items() if k in DIAGNOSIS_KEYS}
        return {KV_USAGE_KEY: self.thresholds.kv_usage_high,
                DIAGNOSIS_KEY: {"window": self.window, "cold_start": self.cold_start,
                                **section}}


def check_share(name: str, value: Any, where: str, *, upper_open: bool = True) -> float:
    """A number strictly between 0 and 1 (or up to 1 with ``upper_open=False``)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {name} must be a number, not {value!r}")
    ok = 0 < value < 1 if upper_open else 0 < value <= 1
    if not ok:
        bound = "between 0 and 1" if upper_open else "in (0, 1]"
        raise ConfigError(f"{where}: {name} must be {bound}, not {value}")
    return float(value)


def check_hit_ratio_mode(value: Any, where: str) -> str:
    """``effective`` or ``device`` (None: the default, effective)."""
    if value is None:
        return DEFAULT_HIT_RATIO_MODE
    if value not in HIT_RATIO_MODES:
        raise ConfigError(f"{where}: {HIT_RATIO_KEY} must be one of "
                          f"{', '.join(HIT_RATIO_MODES)}, not {value!r}")
    return str(value)


def check_duration(name: str, value: Any, where: str) -> str:
    """A Prometheus-style duration ('10m', '90s'), returned as given."""
    try:
        if parse_duration(str(value)) <= 0:
            raise ValueError("must be positive")
    except ValueError as exc:
        raise ConfigError(f"{where}: {name}: {exc}") from exc
    return str(value)


def thresholds_from(data: Mapping[str, Any], where: str,
                    base: DiagnosisThresholds | None = None) -> DiagnosisThresholds:
    """``base`` (default: the documented thresholds) with the keys of ``data`` replaced."""
    base = base or DiagnosisThresholds()
    values: dict[str, Any] = {}
    for key, value in data.items():
        kind = type(getattr(base, key))
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{where}: diagnosis: {key} must be a number, not {value!r}")
        if kind is int and float(value) != int(value):
            raise ConfigError(f"{where}: diagnosis: {key} must be a whole number")
        values[key] = kind(value)
    th = DiagnosisThresholds(**{**asdict(base), **values})
    for name in _SHARES:
        check_share(f"diagnosis.{name}", getattr(th, name), where, upper_open=False)
    if th.min_requests < 1 or th.prompt_variance_ratio <= 1 or th.evict_idle_seconds <= 0:
        raise ConfigError(f"{where}: diagnosis: min_requests >= 1, prompt_variance_ratio > 1, "
                          "evict_idle_seconds > 0")
    return th


def diagnosis_from(config: Mapping[str, Any], where: str) -> DiagnosisSettings:
    """The diagnosis settings of a config file's top level (``hit_ratio_threshold``,
    ``hit_ratio``, ``cold_start``, ``diagnosis:``); keys of ``diagnosis:`` win over the
    top-level ones."""
    section = {} if (given := config.get(DIAGNOSIS_KEY)) is None else given
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}: diagnosis must be a mapping")
    unknown = sorted(set(section) - DIAGNOSIS_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key 'diagnosis.{unknown[0]}'"
                          f"{suggest(unknown[0], DIAGNOSIS_KEYS)}")
    numbers = {k: v for k, v in section.items() if k in THRESHOLD_FIELDS}
    if config.get(THRESHOLD_KEY) is not None and "hit_ratio" not in numbers:
        numbers["hit_ratio"] = check_share(THRESHOLD_KEY, config[THRESHOLD_KEY], where)
    if config.get(KV_USAGE_KEY) is not None:
        numbers[KV_USAGE_KEY] = check_share(KV_USAGE_KEY, config[KV_USAGE_KEY], where,
                                            upper_open=False)
    cold = section.get("cold_start", config.get(COLD_START_KEY))
    window = section.get("window")
    return DiagnosisSettings(
        window=DIAGNOSIS_WINDOW if window is None else check_duration(
            "diagnosis.window", window, where),
        cold_start=COLD_START if cold is None else check_duration("cold_start", cold, where),
        thresholds=thresholds_from(numbers, where),
        hit_ratio_mode=check_hit_ratio_mode(config.get(HIT_RATIO_KEY), where))
