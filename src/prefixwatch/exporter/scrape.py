"""Fetch one /metrics page with the limits a sidecar needs: timeout, size cap, auth, TLS."""

from __future__ import annotations

import time

import requests

from prefixwatch.exporter.config import TargetConfig
from prefixwatch.exporter.pagereader import PageError

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
_CHUNK = 64 * 1024


class Fetcher:
    """One keep-alive HTTP session per target (sessions are not shared across threads)."""

    def __init__(self, target: TargetConfig, user_agent: str) -> None:
        self.target = target
        self.session = requests.Session()
        self.session.headers.update({"Accept": ACCEPT, "User-Agent": user_agent})
        self.session.trust_env = False  # a sidecar talks to its neighbour, never via a proxy

    def close(self) -> None:
        self.session.close()

    def _headers(self) -> dict[str, str]:
        path = self.target.bearer_token_file
        if not path:
            return {}
        try:
            # Read on every poll, as Prometheus does, so a rotated token is picked up.
            with open(path, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise PageError("connect", f"cannot read bearer token file: {exc.strerror}") from exc
        return {"Authorization": f"Bearer {token}"}

    def fetch(self) -> str:
        """The page's text, or PageError with one of the catalog's reasons."""
        target = self.target
        verify: bool | str = target.ca_file or target.tls_verify
        deadline = time.monotonic() + target.timeout
        try:
            with self.session.get(target.url, headers=self._headers(), timeout=target.timeout,
                                  verify=verify, stream=True, allow_redirects=True) as resp:
                if resp.status_code != 200:
                    raise PageError("http_status", f"HTTP {resp.status_code} {resp.reason}")
                ctype = resp.headers.get("Content-Type", "").lower()
                if ctype.startswith(("text/html", "application/json", "application/xml")):
                    raise PageError("not_metrics", f"Content-Type {ctype!r} is not a metrics page")
                declared = resp.headers.get("Content-Length")
                if declared and declared.isdigit() and int(declared) > target.max_body_bytes:
                    raise PageError("too_large", f"body of {declared} bytes is over the cap of "
                                                 f"{target.max_body_bytes}")
                chunks: list[bytes] = []
                size = 0
                for chunk in resp.iter_content(_CHUNK):
                    size += len(chunk)
                    if size > target.max_body_bytes:
                        raise PageError("too_large", f"body passed the cap of "
                                                     f"{target.max_body_bytes} bytes")
                    if time.monotonic() > deadline:
                        raise PageError("timeout", f"body not complete within {target.timeout}s")
                    chunks.append(chunk)
        except PageError:
            raise
        except requests.exceptions.SSLError as exc:
            raise PageError("tls", f"TLS: {_short(exc)}") from exc
        except requests.exceptions.Timeout as exc:
            raise PageError("timeout", f"no answer within {target.timeout}s") from exc
        except requests.exceptions.ChunkedEncodingError as exc:
            raise PageError("parse", f"body cut short: {_short(exc)}") from exc
        except requests.exceptions.ConnectionError as exc:
            if "timed out" in str(exc).lower():
                raise PageError("timeout", f"no answer within {target.timeout}s") from exc
            raise PageError("connect", _short(exc)) from exc
        except requests.exceptions.RequestException as exc:
            raise PageError("connect", _short(exc)) from exc
        body = b"".join(chunks)
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PageError("parse", "body is not UTF-8 text") from exc


def _short(exc: BaseException) -> str:
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out",
                   "certificate verify failed", "Connection reset"):
        if marker in text:
            return marker
    return text[:200]
