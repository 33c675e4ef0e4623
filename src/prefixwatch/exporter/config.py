"""Exporter configuration: flags, a YAML file, or an environment variable, in that order.

Everything has a default that works next to a vLLM on localhost with no configuration at all.
The file is read as the mixin's is (core/yamlfile.py): errors name file:line:column and the
key's path, an unknown key the closest valid one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prefixwatch.core import cliargs
from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab import causes, exposition, settings
from prefixwatch.core.vocab.causes import DiagnosisThresholds
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.core.yamlfile import ConfigFile
from prefixwatch.exporter.requestlog.reader import RequestsLogConfig


@dataclass(frozen=True)
class TargetConfig:
    url: str
    name: str = ""
    timeout: float = exposition.DEFAULT_TIMEOUT_SECONDS
    bearer_token_file: str | None = None
    tls_verify: bool = True
    ca_file: str | None = None
    max_body_bytes: int = exposition.DEFAULT_MAX_BODY_BYTES
    max_series: int = exposition.DEFAULT_MAX_SERIES
    max_models: int = exposition.DEFAULT_MAX_MODELS
    max_label_length: int = exposition.DEFAULT_MAX_LABEL_LENGTH
    max_buckets: int = exposition.DEFAULT_MAX_BUCKETS
    #: The engine's KV event PUB endpoint (vLLM's --kv-events-config endpoint), e.g.
    #: tcp://vllm:5557; None: no event source for this target.
    kv_events: str | None = None
    #: Its replay (ROUTER) endpoint, used to fill a sequence gap.
    kv_events_replay: str | None = None
    #: The topic to subscribe to ("": every topic on the endpoint); in listen mode, the topic
    #: that names this target.
    kv_events_topic: str = ""
    #: The device KV pool in blocks, for the pool what-if when the engine's page does not say
    #: (vLLM's num_gpu_blocks of vllm:cache_config_info wins when it does); None: the page's.
    kv_pool_blocks: int | None = None
    #: ``router`` for a router's page, ``engine`` for an engine's, "" to tell from the page.
    kind: str = ""
    #: A router's worker URL -> the name of the engine target that serves it (besides the
    #: match by URL).
    workers: tuple[tuple[str, str], ...] = ()

    @property
    def display_url(self) -> str:
        """The URL as it may be shown anywhere: without user-info or query values."""
        return redact_url(self.url)


@dataclass(frozen=True)
class ExporterConfig:
    targets: tuple[TargetConfig, ...] = (TargetConfig(exposition.DEFAULT_TARGET),)
    interval: float = exposition.DEFAULT_INTERVAL_SECONDS
    listen_address: str = exposition.DEFAULT_LISTEN_ADDRESS
    windows: tuple[str, ...] = exposition.DEFAULT_WINDOWS
    otlp_endpoint: str | None = None
    diagnosis_window: str = causes.DIAGNOSIS_WINDOW
    cold_start: str = causes.COLD_START
    thresholds: DiagnosisThresholds = DiagnosisThresholds()
    #: Which ratio the diagnosis' hit-ratio threshold judges (core.settings.HIT_RATIO_KEY).
    hit_ratio_mode: str = settings.DEFAULT_HIT_RATIO_MODE
    requests_log: RequestsLogConfig | None = None
    web_config_file: str | None = None
    #: Listen mode: bind this endpoint for engines that connect out (llm-d's layout).
    kv_events_listen: str | None = None
    #: Listen mode: topic -> target name (besides each target's own kv_events_topic).
    kv_events_topics: dict[str, str] = field(default_factory=dict)

    @property
    def window_seconds(self) -> dict[str, float]:
        return {w: parse_duration(w) for w in self.windows}

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return split_host_port(self.listen_address)


def split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"listen address {address!r} is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


_USERINFO = re.compile(r"(?<=//)[^/?#@\s]*@")
_QUERY_VALUE = re.compile(r"(?<=[?&;])([^=&;#\s]*)=[^&;#\s]*")


def redact_url(url: str) -> str:
    """``url`` with user-info and query values replaced by ``***``; works on URLs that do not
    parse, so an error message about a bad URL never shows its password either."""
    url = _USERINFO.sub("***@", url)
    return _QUERY_VALUE.sub(r"\1=***", url)


def validate_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(f"target {redact_url(url)!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"target {redact_url(url)!r} is not an http(s) URL")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ConfigError(f"target {redact_url(url)!r}: {exc}") from None
    return url


_ZMQ_ENDPOINT = re.compile(r"^(tcp://(\[[0-9a-fA-F:.]+\]|[^\s:/\[\]]+):(\d{1,5}|\*)|ipc://\S+)$")


def validate_zmq_endpoint(endpoint: Any, where: str) -> str:
    """A ZMQ endpoint as vLLM's --kv-events-config names one: tcp://HOST:PORT or ipc://PATH."""
    text = str(endpoint).strip()
    port = text.rsplit(":", 1)[-1]
    if not _ZMQ_ENDPOINT.match(text) or (text.startswith("tcp://") and port != "*"
                                         and not 0 < int(port) < 65536):
        raise ConfigError(f"{where}: KV events endpoint {redact_url(text)!r} is not "
                          "tcp://HOST:PORT or ipc://PATH (PORT * to listen on a free one)")
    return text


def default_target_name(url: str) -> str:
    """host:port, as Prometheus' instance label."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def name_targets(targets: list[TargetConfig]) -> tuple[TargetConfig, ...]:
    """Give each target its label: its own name, host:port, or the URL (its display form,
    never a credential) when host:port repeats."""
    names = [t.name or default_target_name(t.url) for t in targets]
    named = [replace(t, name=t.display_url if not t.name and names.count(n) > 1 else n)
             for t, n in zip(targets, names, strict=True)]
    labels = [t.name for t in named]
    duplicates = sorted({n for n in labels if labels.count(n) > 1})
    if duplicates:
        raise ConfigError(f"two targets share the name {duplicates[0]!r}")
    return tuple(named)


_LIMIT_KEYS = ("max_body_bytes", "max_series", "max_models", "max_label_length", "max_buckets")
_KV_TARGET_KEYS = ("kv_events", "kv_events_replay", "kv_events_topic", "kv_pool_blocks")
_TARGET_KEYS = {"url", "name", "timeout", "bearer_token_file", "tls_verify", "ca_file",
                *_LIMIT_KEYS, *_KV_TARGET_KEYS, "kind", "workers"}
_TOP_KEYS = {"targets", "interval", "listen_address", "windows", "otlp_endpoint",
             "target_defaults", "requests_log", "web_config_file", "kv_events_listen",
             "kv_events_topics",
             settings.DIAGNOSIS_KEY, settings.THRESHOLD_KEY, settings.COLD_START_KEY,
             settings.KV_USAGE_KEY,
             settings.HIT_RATIO_KEY}
_REQUESTS_LOG_KEYS = set(RequestsLogConfig.__dataclass_fields__)


def requests_log_from(data: dict[str, Any], where: str) -> RequestsLogConfig:
    """The requests_log section (or the flags, given as the same keys)."""
    if not data.get("path"):
        raise ConfigError(f"{where}: requests_log needs a path")
    try:
        cfg = RequestsLogConfig(**data)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    if cfg.max_log_len is not None and int(cfg.max_log_len) < 1:
        raise ConfigError(f"{where}: max_log_len must be at least 1")
    if int(cfg.max_requests) < 1 or int(cfg.max_blocks) < 1:
        raise ConfigError(f"{where}: max_requests and max_blocks must be at least 1")
    if not cfg.follow and not Path(cfg.path).is_file():
        raise ConfigError(f"requests log {cfg.path!r} does not exist (use --follow to wait "
                          "for it)")
    return cfg


def _pool_blocks(value: Any, where: str) -> int | None:
    """A target's kv_pool_blocks: a whole number of blocks, at least 2 (or absent)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise ConfigError(f"{where}: kv_pool_blocks must be a whole number of KV blocks "
                          f"(at least 2), not {value!r}")
    return value


def _target_from(entry: Any, defaults: dict[str, Any], where: str) -> TargetConfig:
    if isinstance(entry, str):
        entry = {"url": entry}
    if not isinstance(entry, dict) or "url" not in entry:
        raise ConfigError(f"{where}: each target needs a url")
    merged = {**defaults, **entry}
    try:
        timeout = cliargs.seconds(merged.get("timeout", exposition.DEFAULT_TIMEOUT_SECONDS))
    except ValueError as exc:
        raise ConfigError(f"{where}: timeout: {exc}") from None
    try:
        target = TargetConfig(
            url=validate_url(str(merged["url"])),
            name=str(merged.get("name") or ""),
            timeout=timeout,
            bearer_token_file=merged.get("bearer_token_file"),
            tls_verify=bool(merged.get("tls_verify", True)),
            ca_file=merged.get("ca_file"),
            **{k: int(merged[k]) for k in _LIMIT_KEYS if merged.get(k) is not None},
            **{k: validate_zmq_endpoint(entry[k], where) for k in ("kv_events", "kv_events_replay")
               if entry.get(k)},
            kv_events_topic=str(entry.get("kv_events_topic") or ""),
            kind=str(entry.get("kind") or ""),
            workers=_workers_map(entry.get("workers"), where),
            kv_pool_blocks=_pool_blocks(merged.get("kv_pool_blocks"), where),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    if target.kind not in exposition.TARGET_KINDS:
        raise ConfigError(f"{where}: kind {target.kind!r} is not one of "
                          f"{', '.join(repr(k) for k in exposition.TARGET_KINDS if k)}")
    if target.workers and target.kind != exposition.TARGET_KIND_ROUTER:
        raise ConfigError(f"{where}: workers: is for a router target (kind: router)")
    if target.timeout <= 0 or any(getattr(target, k) <= 0 for k in _LIMIT_KEYS):
        raise ConfigError(f"{where}: timeout and {', '.join(_LIMIT_KEYS)} must be positive")
    for path in (target.bearer_token_file, target.ca_file):
        if path and not Path(path).is_file():
            raise ConfigError(f"{where}: file {path!r} does not exist")
    return target


def _workers_map(value: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A router's ``workers:`` map: worker URL (as the router names it) -> engine target name."""
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise ConfigError(f"{where}: workers must map worker URLs to target names")
    return tuple(value.items())


def load_file(path: str | None) -> ConfigFile:
    """The config file, every key checked against the ones its section takes."""
    cf = ConfigFile.load(path) if path else ConfigFile({})
    data = cf.data
    cf.check_keys(data, _TOP_KEYS)
    for key, allowed in (("target_defaults", _TARGET_KEYS - {"url", "name"}),
                         ("requests_log", _REQUESTS_LOG_KEYS),
                         (settings.DIAGNOSIS_KEY, settings.DIAGNOSIS_KEYS)):
        if data.get(key) is not None:
            if not isinstance(data[key], dict):
                raise ConfigError(f"{cf.where(key)}: {key} must be a mapping")
            cf.check_keys(data[key], allowed, key)
    for i, entry in enumerate(data.get("targets") or []):
        if isinstance(entry, dict):
            cf.check_keys(entry, _TARGET_KEYS, "targets", str(i))
    return cf


@dataclass(frozen=True)
class ConfigFlags:
    """What the command line (or a program embedding the exporter) sets: each value wins over
    the file's and the environment's; None (False) when not given. ``requests_log`` holds the
    request-log flags under the requests_log section's keys."""

    targets: Sequence[str] | None = None
    config_file: str | None = None
    interval: float | None = None
    listen_address: str | None = None
    windows: Sequence[str] | None = None
    otlp_endpoint: str | None = None
    timeout: float | None = None
    bearer_token_file: str | None = None
    ca_file: str | None = None
    insecure_skip_verify: bool = False
    max_body_bytes: int | None = None
    web_config_file: str | None = None
    diagnosis_window: str | None = None
    cold_start: str | None = None
    requests_log: Mapping[str, Any] | None = None
    kv_events: str | None = None


def build_config(flags: ConfigFlags = ConfigFlags(),
                 environ: Mapping[str, str] | None = None) -> ExporterConfig:
    """Flags win over the file, the file over the environment, the environment over defaults."""
    env = os.environ if environ is None else environ
    cf = load_file(flags.config_file or env.get(exposition.ENV_CONFIG) or None)
    data = cf.data
    targets = _targets(flags, cf, env)
    listen, topics = _kv_events_listen(cf), _kv_events_topics(cf)
    found = settings.diagnosis_from(data, cf.where(settings.DIAGNOSIS_KEY))
    requests_log = _requests_log(flags, cf)
    try:
        cfg = ExporterConfig(
            targets=name_targets(targets),
            interval=float(flags.interval if flags.interval is not None
                           else _file_seconds(data, cf, "interval",
                                              exposition.DEFAULT_INTERVAL_SECONDS)),
            listen_address=str(flags.listen_address or data.get("listen_address")
                               or exposition.DEFAULT_LISTEN_ADDRESS),
            windows=tuple(flags.windows or data.get("windows") or exposition.DEFAULT_WINDOWS),
            otlp_endpoint=flags.otlp_endpoint or data.get("otlp_endpoint"),
            diagnosis_window=flags.diagnosis_window or found.window,
            cold_start=flags.cold_start or found.cold_start,
            thresholds=found.thresholds,
            hit_ratio_mode=found.hit_ratio_mode,
            requests_log=requests_log,
            web_config_file=flags.web_config_file or data.get("web_config_file") or None,
            kv_events_listen=listen,
            kv_events_topics=topics,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    _validate(cfg, flags, cf)
    return cfg


def _targets(flags: ConfigFlags, cf: ConfigFile, env: Mapping[str, str]) -> list[TargetConfig]:
    """The targets of the flags, else the file's, else the environment's, else the default;
    each with the target flags and the file's target_defaults."""
    data = cf.data
    defaults: dict[str, Any] = dict(data.get("target_defaults") or {})
    given = {"timeout": flags.timeout, "bearer_token_file": flags.bearer_token_file,
             "ca_file": flags.ca_file, "max_body_bytes": flags.max_body_bytes,
             "tls_verify": False if flags.insecure_skip_verify else None}
    defaults.update({k: v for k, v in given.items() if v is not None})
    if flags.targets:
        places = ["--target"] * len(flags.targets)
        entries: list[Any] = list(flags.targets)
    elif data.get("targets"):
        entries = list(data["targets"])
        places = [cf.where("targets", str(i)) for i in range(len(entries))]
    elif env.get(exposition.ENV_TARGETS, "").strip():
        entries = [u.strip() for u in env[exposition.ENV_TARGETS].split(",") if u.strip()]
        places = [exposition.ENV_TARGETS] * len(entries)
    else:
        entries, places = [exposition.DEFAULT_TARGET], ["default target"]
    target_list = [_target_from(e, defaults, at) for e, at in zip(entries, places, strict=True)]
    if flags.kv_events:
        if len(target_list) != 1:
            raise ConfigError("--kv-events is for one target (the sidecar); with several, "
                              "give each target its kv_events in the config file")
        target_list[0] = replace(target_list[0],
                                 kv_events=validate_zmq_endpoint(flags.kv_events, "--kv-events"))
    return target_list


def _kv_events_listen(cf: ConfigFile) -> str | None:
    listen = cf.data.get("kv_events_listen")
    return None if listen is None else validate_zmq_endpoint(listen, cf.where("kv_events_listen"))


def _kv_events_topics(cf: ConfigFile) -> dict[str, str]:
    topics = cf.data.get("kv_events_topics") or {}
    if not isinstance(topics, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in topics.items()):
        raise ConfigError(f"{cf.where('kv_events_topics')}: kv_events_topics must map topics "
                          "to target names")
    return dict(topics)


def _requests_log(flags: ConfigFlags, cf: ConfigFile) -> RequestsLogConfig | None:
    """The file's requests_log section with the request-log flags over it (None: neither)."""
    log_data: dict[str, Any] = dict(cf.data.get("requests_log") or {})
    given = {k: v for k, v in (flags.requests_log or {}).items() if v is not None}
    unknown = set(given) - _REQUESTS_LOG_KEYS
    if unknown:
        raise ConfigError(f"unknown requests_log key {sorted(unknown)[0]!r}")
    log_data.update(given)
    if not log_data:
        return None
    return requests_log_from(log_data, given and "--requests-log" or cf.where("requests_log"))


def _file_seconds(data: dict, cf: ConfigFile, key: str, default: float) -> float:
    """A duration of the file (5s, or bare seconds, like its flag); one line naming the
    file's place and the key when it is none."""
    try:
        return cliargs.seconds(data.get(key, default))
    except ValueError as exc:
        raise ConfigError(f"{cf.where(key)}: {key}: {exc}") from None


def _validate(cfg: ExporterConfig, flags: ConfigFlags, cf: ConfigFile) -> None:
    """What the config's values must be; an error names the flag or the file's place."""

    def at(key: str, flag: object, name: str = "") -> str:
        """Where a value came from: its flag, or its place in the file."""
        return (name or f"--{key.replace('_', '-')}") if flag else cf.where(key)

    if cfg.interval <= 0:
        raise ConfigError(f"{at('interval', flags.interval is not None)}: interval must be "
                          "positive")
    try:
        split_host_port(cfg.listen_address)
    except ConfigError as exc:
        raise ConfigError(f"{at('listen_address', flags.listen_address)}: {exc}") from None
    try:
        cfg.window_seconds  # noqa: B018 - validates ('lifetime' is no duration: always added)
    except ValueError as exc:
        raise ConfigError(f"{at('windows', flags.windows, '--window')}: {exc}") from exc
    for name, value in (("diagnosis window", cfg.diagnosis_window),
                        ("cold start", cfg.cold_start)):
        try:
            parse_duration(value)
        except ValueError as exc:
            raise ConfigError(f"{name}: {exc}") from exc
    if cfg.otlp_endpoint:
        try:
            validate_url(cfg.otlp_endpoint)
        except ConfigError as exc:
            raise ConfigError(f"{at('otlp_endpoint', flags.otlp_endpoint)}: {exc}") from None
    known = {t.name for t in cfg.targets}
    for t in cfg.targets:
        for worker, name in t.workers:
            if name not in known:
                raise ConfigError(f"target {t.name!r}: workers: {redact_url(worker)!r} names no "
                                  f"target ({name!r})")
    for topic, name in cfg.kv_events_topics.items():
        if name not in known:
            raise ConfigError(f"kv_events_topics: topic {topic!r} names no target ({name!r})")
