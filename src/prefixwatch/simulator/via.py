"""Send a scenario's requests through a router (``prefixwatch simulate --via URL``).

The replicas still serve and publish their KV event streams; the router (vllm-router, smg, a
gateway) chooses which replica serves each request, as in production. Open loop like the
built-in routing: a bounded pool of senders, each request under one deadline; a request that
finds every sender busy is counted as dropped, never queued without bound.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("prefixwatch.simulate")

#: Requests in flight through the router at once; past it a request is dropped and counted.
MAX_IN_FLIGHT = 64
#: One request's deadline (connect, send, the whole answer).
REQUEST_TIMEOUT_SECONDS = 60.0


def check_via(url: str) -> str:
    """The router's base URL (http(s)://host:port[/prefix]); ValueError when it is not one."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--via {url!r} is not an http(s) URL")
    return url.rstrip("/")


def endpoint_for(body: dict[str, Any]) -> str:
    """The OpenAI route a request body belongs to."""
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


class ViaRouter:
    """Posts request bodies to a router, a bounded number at a time."""

    def __init__(self, base_url: str, model: str | None = None,
                 timeout: float = REQUEST_TIMEOUT_SECONDS,
                 max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.base_url = check_via(base_url)
        #: Named in each request without a model: a gateway (smg) routes by it.
        self.model = model
        self.timeout = timeout
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self.sent = self.failed = self.dropped = 0

    def submit(self, body: dict[str, Any]) -> bool:
        """Start sending ``body``; False (and counted) when every sender is busy."""
        if not self._slots.acquire(blocking=False):
            with self._lock:
                self.dropped += 1
                dropped = self.dropped
            if dropped in (1, 10, 100) or dropped % 1000 == 0:
                log.warning("--via: %d requests dropped: %d already in flight to the router",
                            dropped, MAX_IN_FLIGHT)
            return False
        if self._closed.is_set():
            self._slots.release()
            return False
        # A daemon thread per request in flight (at most max_in_flight): a request still
        # waiting on the router never holds up the process's exit.
        threading.Thread(target=self._send, args=(body,), name="via", daemon=True).start()
        return True

    def send(self, body: dict[str, Any]) -> dict[str, Any]:
        """Send one request and wait for its answer (the JSON body)."""
        if self.model and "model" not in body:
            body = {"model": self.model, **body}
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + endpoint_for(body), data,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310
            return json.loads(answer.read())

    def _send(self, body: dict[str, Any]) -> None:
        try:
            self.send(body)
            with self._lock:
                self.sent += 1
        except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, bad JSON
            with self._lock:
                self.failed += 1
                failed = self.failed
            if failed in (1, 10, 100) or failed % 1000 == 0:
                detail = f"HTTP {exc.code}" if isinstance(exc, urllib.error.HTTPError) else (
                    str(getattr(exc, "reason", exc)))
                log.warning("--via: a request through %s failed (%d so far): %s",
                            self.base_url, failed, detail)
        finally:
            self._slots.release()

    def close(self) -> None:
        """Send nothing more; requests in flight end by their deadline (daemon threads)."""
        self._closed.set()
