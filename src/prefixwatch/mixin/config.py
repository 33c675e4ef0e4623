"""ONE config for the whole mixin, like kubernetes-mixin's ``_config``.

Rules, recording rules, alerts, Alertmanager routing, dashboards, the Kubernetes manifests (and
the exporter config they mount) all read a ``MixinConfig``; every threshold, selector and alert
window is one of its keys. ``alerts/mixin.example.yml`` documents every key. Errors name
the file, line and column of the offending key, as a compiler would.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from prefixwatch.core.errors import ConfigError
from prefixwatch.core.story import window_words
from prefixwatch.core.vocab import exposition, rulenames, settings
from prefixwatch.core.vocab.causes import COLD_START, DiagnosisThresholds
from prefixwatch.core.vocab.settings import DiagnosisSettings
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.core.yamlfile import ConfigFile

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: The fewest samples (scrapes, at the evaluation interval) the critical alert's short window
#: may rest on: four at a 15 s scrape over one minute.
MIN_SAMPLES = 4
_MATCHER = r'\s*[a-zA-Z_]\w*\s*(?:=|!=|=~|!~)\s*"(?:[^"\\]|\\.)*"\s*'
_MATCHERS = re.compile(rf"(?:{_MATCHER})(?:,(?:{_MATCHER}))*,?\s*")
#: Labels the mixin itself aggregates by: a cluster label must be another one.
_RESERVED_LABELS = {exposition.L_MODEL, exposition.L_TARGET, "instance", "job", "le", "quantile",
                    exposition.L_CAUSE, "alertname", "severity"}


@dataclass(frozen=True)
class ModelOverride:
    """Per model: another hit-ratio threshold, or no hit-rate alerts at all."""

    threshold: float | None = None
    disabled: bool = False


@dataclass(frozen=True)
class DashboardSettings:
    """What a dashboard opens with."""

    refresh: str = "30s"
    time_from: str = "now-3h"
    time_to: str = "now"
    timezone: str = "browser"


@dataclass(frozen=True)
class MixinConfig:
    """Everything a user may tune; the defaults are the documented ones."""

    #: Regex of the scrape job(s) whose series the rules read ('' = every job).
    job: str = ""
    #: Extra matchers added to every raw series, e.g. 'namespace="prod"'.
    matchers: str = ""
    #: Label naming the Prometheus (cluster) a series comes from, in a global view.
    cluster_label: str | None = None
    hit_ratio_threshold: float = exposition.DEFAULT_HIT_RATIO_THRESHOLD
    #: Which ratio the hit-rate alerts judge: ``effective`` (prompt tokens served from any
    #: cache tier) or ``device`` (the engine's own KV pool); core.settings parses the key.
    hit_ratio: str = settings.DEFAULT_HIT_RATIO_MODE
    models: Mapping[str, ModelOverride] = field(default_factory=dict)
    #: Windows of the recorded fleet hit ratios (the alerts' windows and the dashboards' 5m
    #: are recorded whatever this says).
    windows: tuple[str, ...] = rulenames.RATIO_WINDOWS
    #: PrefixCacheHitRateLow (critical), for ``critical_for``: the short window below
    #: ``critical_collapse_share`` of the threshold (a collapse, unmistakable within a few
    #: samples), or below the threshold with the long window below it too (a shallower fall,
    #: which a short dip must not fake). The short window is the ratio the page carries and
    #: ends the page soon after a recovery; it needs four samples (four evaluation intervals).
    critical_short_window: str = settings.CRITICAL_SHORT_WINDOW
    critical_long_window: str = settings.CRITICAL_LONG_WINDOW
    critical_for: str = settings.CRITICAL_FOR
    critical_collapse_share: float = settings.CRITICAL_COLLAPSE_SHARE
    #: The warning-level alerts (PrefixCacheHitRateLow warning, Regression, ReplicaOutlier,
    #: TierIdle, DeviceShareLow, OffloadFailures) judge this window, recorded per model and per
    #: replica; a drift must last ``warning_for`` to open a ticket.
    warning_window: str = "15m"
    warning_for: str = "15m"
    #: PrefixCacheHitRateRegression: the model's ratio over ``regression_window`` against the
    #: baseline (the ratio over ``baseline_window`` ending ``baseline_offset`` ago), the drop
    #: held ``regression_for``: 5m/5m is the quickest that files no dip too short to page
    #: (a dip to 40% under two minutes holds the 5-minute ratio under for at most 3.5).
    regression_window: str = "5m"
    regression_for: str = "5m"
    baseline_window: str = "2h"
    baseline_offset: str = "1h"
    #: PrefixCacheEvictionPressure: how long a full pool with preemptions must last.
    eviction_for: str = "10m"
    #: PrefixCacheTierIdle and PrefixCacheDeviceShareLow: how long before a ticket.
    tier_for: str = "30m"
    #: Prompt tokens per second (per model) below which no hit-rate alert fires.
    min_query_tokens_per_second: float = 100.0
    #: A model whose counters reset within this long is warming up: no hit-rate alert.
    cold_start: str = COLD_START
    regression_drop: float = 0.15
    outlier_gap: float = 0.25
    #: PrefixCacheEvictionPressure and the diagnosis' eviction_pressure: KV usage above this.
    kv_usage_high: float = DiagnosisThresholds.kv_usage_high
    #: PrefixCacheOffloadFailures: this share of the offload connector's stores lost.
    offload_failure_share: float = 0.10
    #: PrefixCacheEvictionOfReusedContent and PrefixCacheRoutingWaste (KV events): the
    #: eviction part of a replica's prompt tokens, or the routing part of a model's, at the
    #: diagnosis' ``routing_gap`` or more (the share at which the diagnosis names
    #: eviction_pressure and routing_spread from the ledger: one threshold for the cause and
    #: the alert), over ``kv_window`` for ``kv_for``.
    kv_window: str = "15m"
    kv_for: str = "15m"
    #: PrefixCacheRouterIndexStale: a router's predicted hit share this far above the hit
    #: ratio its engines deliver (token-weighted), over ``router_window``, for ``router_for``.
    router_gap: float = 0.3
    router_window: str = "5m"
    router_for: str = "10m"
    #: PrefixCacheRouterKVFeedDegraded: the router's own KV event feed reports gaps, resyncs
    #: or failures within ``router_window``, for this long.
    router_feed_for: str = "5m"
    runbook_url_pattern: str = rulenames.DEFAULT_RUNBOOK_URL_PATTERN
    evaluation_interval: str = "15s"
    #: Multiplies every window and `for` (tests and the demo run the same rules in seconds).
    time_scale: float = 1.0
    #: vLLM's --block-size and SGLang's --page-size, for the dashboards' texts.
    block_size: int = 16
    page_size: int = 1
    dashboards: DashboardSettings = field(default_factory=DashboardSettings)
    #: The ``diagnosis:`` section as written (keys of ``core.causes.DiagnosisThresholds``,
    #: window, cold_start); unset keys follow hit_ratio_threshold and cold_start.
    diagnosis_overrides: Mapping[str, Any] = field(default_factory=dict)

    # -- derived -----------------------------------------------------------------------------

    @property
    def critical_windows(self) -> tuple[str, str]:
        return (self.critical_short_window, self.critical_long_window)

    @property
    def recorded_windows(self) -> tuple[str, ...]:
        """The fleet ratio windows to record: ``windows`` plus the alerts' and the
        dashboards', by length."""
        return _by_length({*self.windows, *self.critical_windows, self.regression_window,
                           *self.target_windows})

    @property
    def target_windows(self) -> tuple[str, ...]:
        """The per-replica ratio windows to record: the dashboards' and the warnings'."""
        return _by_length({rulenames.REPLICA_WINDOW, self.warning_window})

    @property
    def selector(self) -> str:
        """The matchers every raw series gets: job and the extra matchers."""
        parts = [f'job=~"{self.job}"'] if self.job else []
        if self.matchers.strip():
            parts.append(self.matchers.strip().rstrip(","))
        return ",".join(parts)

    @property
    def diagnosis(self) -> DiagnosisSettings:
        """The exporter's diagnosis settings this config implies (one threshold, one cold
        start: the diagnosis section only for what differs)."""
        return settings.diagnosis_from(
            {settings.THRESHOLD_KEY: self.hit_ratio_threshold,
             settings.HIT_RATIO_KEY: self.hit_ratio,
             settings.COLD_START_KEY: self.cold_start,
             settings.KV_USAGE_KEY: self.kv_usage_high,
             settings.DIAGNOSIS_KEY: dict(self.diagnosis_overrides)}, "mixin config")

    def runbook(self, anchor: str) -> str:
        """The runbook URL of one section (anchors are lower-case)."""
        return self.runbook_url_pattern.replace("{anchor}", anchor.lower())

    @property
    def runbook_home(self) -> str:
        """The runbook page itself, for dashboard links."""
        return self.runbook_url_pattern.replace("#{anchor}", "").replace("{anchor}", "")

    def baseline(self, effective: bool = False) -> str:
        """The recorded baseline ratio a regression is judged against."""
        return rulenames.r_baseline(self.baseline_window, self.baseline_offset, effective)

    def scaled(self, duration: str) -> str:
        return prom_duration(parse_duration(duration) * self.time_scale)


def _by_length(windows: set[str]) -> tuple[str, ...]:
    return tuple(sorted(windows, key=parse_duration))


def prom_duration(seconds: float) -> str:
    """Seconds as a Prometheus duration ('1h30m', '45s', '500ms')."""
    if round(seconds * 1000) <= 0:
        raise ValueError("duration must be positive")
    return window_words(seconds)


# -- loading -----------------------------------------------------------------------------------

_SIMPLE = {f.name for f in fields(MixinConfig)} - {
    "job", "matchers", "models", "dashboards", "diagnosis_overrides", "windows"}
TOP_KEYS = frozenset(_SIMPLE | {"selectors", "models", "dashboards", "diagnosis", "windows"})
_DASHBOARD_KEYS = {f.name for f in fields(DashboardSettings)}


def load_config(path: str | None = None, threshold: float | None = None,
                data: Mapping[str, Any] | None = None) -> MixinConfig:
    """The config of a YAML file (or of ``data``), with ``threshold`` (the --threshold flag)
    winning over the file. ConfigError names file:line:column and the path of a bad key."""
    cf = (ConfigFile.load(path, "mixin config") if path
             else ConfigFile(data or {}, what="mixin config"))
    data = dict(cf.data)
    cf.check_keys(data, TOP_KEYS)
    if threshold is not None:
        data["hit_ratio_threshold"] = threshold
    kwargs: dict[str, Any] = {}
    defaults = MixinConfig()
    for key in _SIMPLE & set(data):
        if data[key] is not None:
            is_text = isinstance(getattr(defaults, key), str) or key == "cluster_label"
            kwargs[key] = str(data[key]) if is_text else data[key]
    kwargs.update(_selectors(data, cf))
    kwargs["models"] = _models(data.get("models"), cf)
    if data.get("windows") is not None:
        kwargs["windows"] = _windows(data["windows"], cf)
    if data.get("dashboards") is not None:
        kwargs["dashboards"] = _dashboards(data["dashboards"], cf)
    if data.get("diagnosis") is not None:
        if not isinstance(data["diagnosis"], Mapping):
            raise ConfigError(f"{cf.where('diagnosis')}: diagnosis must be a mapping")
        cf.check_keys(data["diagnosis"], settings.DIAGNOSIS_KEYS, "diagnosis")
        kwargs["diagnosis_overrides"] = dict(data["diagnosis"])
    try:
        cfg = MixinConfig(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{cf.path}: {exc}") from exc
    _check(cfg, cf)
    return cfg


def _selectors(data: Mapping[str, Any], cf: ConfigFile) -> dict[str, str]:
    section = data.get("selectors") or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{cf.where('selectors')}: selectors takes job: and matchers:")
    cf.check_keys(section, ("job", "matchers"), "selectors")
    out = {k: str(v) for k, v in section.items() if v is not None}
    matchers = out.get("matchers", "")
    if matchers.strip() and not _MATCHERS.fullmatch(matchers):
        raise ConfigError(f"{cf.where('selectors', 'matchers')}: matchers (selector) must look "
                          'like job="vllm",namespace="prod"')
    if '"' in out.get("job", "") or "\\" in out.get("job", ""):
        raise ConfigError(f"{cf.where('selectors', 'job')}: job is a regex without quotes")
    return out


def _models(section: Any, cf: ConfigFile) -> dict[str, ModelOverride]:
    if section is None:
        return {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"{cf.where('models')}: models must map a model name to its "
                          "settings")
    out = {}
    for model, spec in section.items():
        at = cf.where("models", str(model))
        if not isinstance(spec, Mapping):
            raise ConfigError(f"{at}: models.{model}: use threshold: and/or disabled:")
        cf.check_keys(spec, ("threshold", "disabled"), "models", str(model))
        value = spec.get("threshold")
        out[str(model)] = ModelOverride(
            threshold=None if value is None else settings.check_share(
                f"models.{model}.threshold", value, at),
            disabled=bool(spec.get("disabled", False)))
    return out


def _windows(value: Any, cf: ConfigFile) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{cf.where('windows')}: windows is a list of durations")
    return tuple(settings.check_duration("windows", str(w), cf.where("windows", str(i)))
                 for i, w in enumerate(value))


def _dashboards(value: Any, cf: ConfigFile) -> DashboardSettings:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{cf.where('dashboards')}: dashboards takes "
                          f"{', '.join(sorted(_DASHBOARD_KEYS))}")
    cf.check_keys(value, _DASHBOARD_KEYS, "dashboards")
    out = DashboardSettings(**{k: str(v) for k, v in value.items()})
    settings.check_duration("dashboards.refresh", out.refresh,
                            cf.where("dashboards", "refresh"))
    return out


def _check(cfg: MixinConfig, cf: ConfigFile) -> None:
    for name in ("hit_ratio_threshold", "regression_drop", "outlier_gap", "kv_usage_high",
                 "offload_failure_share", "critical_collapse_share", "router_gap"):
        settings.check_share(name, getattr(cfg, name), cf.where(name))
    for name in ("cold_start", "evaluation_interval", "critical_short_window",
                 "critical_long_window", "critical_for", "warning_window", "warning_for",
                 "regression_window", "regression_for", "baseline_window", "baseline_offset",
                 "eviction_for", "tier_for", "kv_window", "kv_for", "router_window",
                 "router_for", "router_feed_for"):
        settings.check_duration(name, getattr(cfg, name), cf.where(name))
    if parse_duration(cfg.critical_short_window) >= parse_duration(cfg.critical_long_window):
        raise ConfigError(f"{cf.where('critical_short_window')}: critical_short_window must be "
                          "shorter than critical_long_window")
    interval = parse_duration(cfg.evaluation_interval)
    if parse_duration(cfg.critical_short_window) < MIN_SAMPLES * interval:
        key = "critical_short_window" if "critical_short_window" in cf.data else (
            "evaluation_interval")
        raise ConfigError(
            f"{cf.where(key)}: critical_short_window must hold at least "
            f"{MIN_SAMPLES} evaluation intervals ({prom_duration(MIN_SAMPLES * interval)} at "
            f"evaluation_interval {cfg.evaluation_interval}): a shorter rate() rests on too few "
            "scrapes to page on")
    settings.check_hit_ratio_mode(cfg.hit_ratio, cf.where(settings.HIT_RATIO_KEY))
    for name in ("time_scale", "min_query_tokens_per_second", "block_size", "page_size"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 or (
                value == 0 and name != "min_query_tokens_per_second"):
            raise ConfigError(f"{cf.where(name)}: {name} must be a positive number")
    if cfg.cluster_label is not None and (
            not _LABEL.fullmatch(cfg.cluster_label) or cfg.cluster_label in _RESERVED_LABELS):
        raise ConfigError(f"{cf.where('cluster_label')}: cluster_label must be a label name other "
                          f"than {', '.join(sorted(_RESERVED_LABELS))}")
    if "{anchor}" not in cfg.runbook_url_pattern:
        raise ConfigError(f"{cf.where('runbook_url_pattern')}: runbook_url_pattern needs "
                          "{anchor} (the section, e.g. prefixcachehitratelow)")
    try:
        cfg.diagnosis  # noqa: B018 - validates the diagnosis section
    except ConfigError as exc:
        raise ConfigError(f"{cf.where('diagnosis')}: {str(exc).split(': ', 1)[1]}") from exc
