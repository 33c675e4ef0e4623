"""A router's workers -> the engine targets that serve them.

A router names its workers by URL (``http://10.0.0.7:8000``); the exporter names its engine
targets by name, each with the URL of its page (``http://10.0.0.7:8000/metrics``). A worker
is matched by the router's ``workers:`` map first, else to the engine target with the same
scheme, host and port. A worker that matches none is counted with its reason (``no_target``),
never dropped silently; a target already claimed by a router earlier in the config is counted
``shared`` for the later one, so each engine target belongs to one router and the recording
rules' join (believed vs delivered) stays one-to-one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from prefixwatch.core.vocab import exposition


@dataclass(frozen=True)
class RouterView:
    """One router as the collector and the pages read it: its last page and its workers."""

    name: str
    kind: str
    up: bool
    reading: object  # RouterReading (immutable once read)
    errors: Mapping[str, int]
    matched: Mapping[str, str] = field(default_factory=dict)  # worker -> engine target
    unmatched: Mapping[str, str] = field(default_factory=dict)  # worker -> reason


def address(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of a URL, the default port filled in; None when it has none."""
    try:
        parts = urlsplit(url if "//" in url else f"http://{url}")
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return None
    if not parts.hostname:
        return None
    return parts.scheme or "http", parts.hostname.lower(), port


def match_workers(routers: Iterable[tuple[str, list[str], Mapping[str, str]]],
                  engines: Iterable[tuple[str, str]]
                  ) -> dict[str, tuple[dict[str, str], dict[str, str]]]:
    """For each router (name, its workers, its ``workers:`` map), in config order, given the
    engine targets (name, page URL): ({worker: target}, {worker: reason})."""
    engine_list = list(engines)
    by_address = {}
    for name, url in engine_list:
        at = address(url)
        if at is not None:
            by_address.setdefault(at, name)
    engine_names = {name for name, _ in engine_list}
    claimed: dict[str, str] = {}
    out: dict[str, tuple[dict[str, str], dict[str, str]]] = {}
    for router, workers, explicit in routers:
        matched: dict[str, str] = {}
        unmatched: dict[str, str] = {}
        for worker in workers:
            target = explicit.get(worker)
            if target not in engine_names:
                at = address(worker)
                target = by_address.get(at) if at is not None else None
            if target is None:
                unmatched[worker] = exposition.ROUTER_UNMATCHED_NO_TARGET
            elif claimed.setdefault(target, router) != router:
                unmatched[worker] = exposition.ROUTER_UNMATCHED_SHARED
            else:
                matched[worker] = target
        out[router] = (matched, unmatched)
    return out
