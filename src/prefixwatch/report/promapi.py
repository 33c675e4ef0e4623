"""A small client for Prometheus' HTTP API: instant and range queries, one deadline each.

`requests` timeouts bound each socket operation, not the whole answer, so the body is read in
chunks against one deadline per request, and capped in size: a slow or huge answer is a clear
error, never a hang.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import requests

from prefixwatch.core import neterrors
from prefixwatch.core.errors import ConfigError

MAX_BODY_BYTES = 64 * 1024 * 1024
#: Prometheus refuses a range query of more than 11,000 points per series.
MAX_POINTS = 11_000


class ReportError(ConfigError):
    """Prometheus cannot be read, or holds nothing to report on (one line, exit 2)."""


@dataclass(frozen=True)
class Series:
    """One series of a query's answer: its labels and (unix time, value) samples."""

    labels: dict[str, str]
    samples: list[tuple[float, float]]


@dataclass(frozen=True)
class RecordingRule:
    """One loaded recording rule: its PromQL and how often its group evaluates (seconds;
    None when Prometheus does not say)."""

    query: str
    interval: float | None


class PromClient:
    """Read-only access to one Prometheus server, under one deadline for the whole exchange:
    ``timeout`` seconds from the client's creation for every query together, each request
    given what is left (a slow Prometheus fails the report once, not once a query)."""

    def __init__(self, base_url: str, timeout: float = 60.0,
                 session: requests.Session | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ReportError(f"--prometheus must be an http(s) URL, not {base_url!r}")
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.session = session or requests.Session()

    def close(self) -> None:
        self.session.close()

    def _late(self) -> ReportError:
        return ReportError(f"Prometheus at {self.base} did not answer the report's queries "
                           f"within {self.timeout:g}s (--timeout)")

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        url = f"{self.base}{path}"
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._late()
        params = {**params, "timeout": f"{max(1, int(left))}s"}
        try:
            resp = self.session.get(url, params=params, stream=True,
                                    timeout=(min(5.0, left), left))
            body = bytearray()
            for chunk in resp.iter_content(64 * 1024):
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise ReportError(f"{url}: answer larger than {MAX_BODY_BYTES} bytes; "
                                      "narrow the range")
                if time.monotonic() > self.deadline:
                    raise self._late()
            resp.close()
        except requests.Timeout:
            raise self._late() from None
        except requests.RequestException as exc:
            raise ReportError(f"cannot reach Prometheus: {neterrors.describe(exc, self.base)}"
                              ) from None
        try:
            payload = json.loads(bytes(body))
        except ValueError:
            raise ReportError(f"{url} answered HTTP {resp.status_code} with something other "
                              "than JSON: is this a Prometheus server?") from None
        if not isinstance(payload, dict) or payload.get("status") != "success":
            error = payload.get("error") if isinstance(payload, dict) else None
            raise ReportError(f"Prometheus refused the query ({resp.status_code}): "
                              f"{error or 'no reason given'}")
        return payload.get("data")

    def query(self, expr: str, at: float) -> list[Series]:
        """An instant query at ``at``; a range selector gives raw samples (a matrix)."""
        return _series(self._get("/api/v1/query", {"query": expr, "time": f"{at:.3f}"}))

    def recording_rules(self) -> dict[str, RecordingRule]:
        """The recording rules Prometheus has loaded: recorded name -> its expression and
        its group's evaluation interval."""
        data = self._get("/api/v1/rules", {"type": "record"})
        out = {}
        for group in (data or {}).get("groups") or []:
            interval = group.get("interval")
            every = float(interval) if isinstance(interval, (int, float)) and interval > 0 else None
            for rule in group.get("rules") or []:
                if isinstance(rule, dict) and rule.get("name") and rule.get("query"):
                    out[str(rule["name"])] = RecordingRule(str(rule["query"]), every)
        return out

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        step = max(step, (end - start) / MAX_POINTS, 0.001)
        return _series(self._get("/api/v1/query_range", {
            "query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}))


def _series(data: Any) -> list[Series]:
    if not isinstance(data, dict):
        return []
    kind, result = data.get("resultType"), data.get("result") or []
    out = []
    for item in result:
        labels = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
        if kind == "matrix":
            samples = [(float(t), float(v)) for t, v in item.get("values") or []]
        elif kind == "vector":
            t, v = item["value"]
            samples = [(float(t), float(v))]
        else:
            continue
        out.append(Series(labels, samples))
    return out
