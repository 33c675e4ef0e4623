"""One human sentence for a failed HTTP request, instead of urllib3's nested reprs.

``HTTPConnectionPool(host=..., port=1): Max retries exceeded ... [Errno 111] Connection
refused`` becomes ``nothing answers at http://127.0.0.1:1 (connection refused): is the server
running and is the address right?``.
"""

from __future__ import annotations

import errno

import requests


def _errno_in_chain(exc: BaseException) -> int | None:
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno:
            return e.errno
        todo += [e.__cause__, e.__context__, *[a for a in e.args if isinstance(a, BaseException)]]
        reason = getattr(e, "reason", None)
        if isinstance(reason, BaseException):
            todo.append(reason)
    return None


def describe(exc: requests.RequestException, url: str) -> str:
    """``url`` and why the request to it failed, in words a user can act on."""
    text = str(exc)
    if isinstance(exc, (requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema,
                        requests.exceptions.InvalidURL)):
        return f"{url!r} is not an http(s) URL (e.g. http://localhost:8000)"
    if isinstance(exc, requests.exceptions.SSLError):
        return f"the TLS handshake with {url} failed (certificate or not an HTTPS server)"
    if isinstance(exc, requests.exceptions.Timeout):
        return f"{url} did not answer in time"
    code = _errno_in_chain(exc)
    if code == errno.ECONNREFUSED or "Connection refused" in text:
        return (f"nothing answers at {url} (connection refused): is the server running and "
                "is the address right?")
    if "Name or service not known" in text or "Failed to resolve" in text or (
            "NameResolutionError" in text):
        return f"the host name of {url} does not resolve"
    if code in (errno.EHOSTUNREACH, errno.ENETUNREACH):
        return f"{url} is unreachable from here (no route to the host)"
    if isinstance(exc, requests.ConnectionError):
        return f"the connection to {url} failed ({type(exc).__name__})"
    return f"the request to {url} failed ({type(exc).__name__})"
