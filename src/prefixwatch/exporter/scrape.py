"""Fetch one /metrics page under one deadline for the whole exchange.

A socket timeout bounds each read, not the exchange: a peer sending one byte a second (in the
headers, the body or along a chain of redirects) never trips it. So every poll gets one
monotonic deadline; before each blocking step the socket's timeout is shrunk to the time left,
and a watchdog thread shuts the socket down when the deadline passes, which ends whatever read
is in progress. The exchange is plain ``http.client`` on a socket we own, so the watchdog can
reach the socket in every phase (connect, TLS handshake, status line, headers, body).
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import http.client
import itertools
import socket
import ssl
import threading
import time
import zlib
from dataclasses import dataclass, field
from urllib.parse import unquote, urljoin, urlsplit

from prefixwatch.exporter.config import TargetConfig
from prefixwatch.exporter.pagereader import PageError

ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"
MAX_REDIRECTS = 5
_CHUNK = 64 * 1024
_REDIRECTS = {301, 302, 303, 307, 308}


@dataclass(order=True)
class _Ticket:
    deadline: float
    seq: int
    sock: socket.socket | None = field(compare=False, default=None)
    fired: bool = field(compare=False, default=False)
    done: bool = field(compare=False, default=False)
    aborted: bool = field(compare=False, default=False)  # fired by abort_all, not its deadline


class Aborted(Exception):
    """A poll cut off because the process is stopping: says nothing about the target."""


class Watchdog:
    """One thread that shuts sockets down when their deadline passes (or on abort_all)."""

    def __init__(self) -> None:
        self._heap: list[_Ticket] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, deadline: float) -> _Ticket:
        ticket = _Ticket(deadline, next(self._seq))
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="poll-watchdog",
                                                daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, ticket)
            self._cond.notify()
        return ticket

    def watch(self, ticket: _Ticket, sock: socket.socket) -> None:
        """Point the ticket at the socket now in use; shut it at once if already late."""
        with self._cond:
            ticket.sock = sock
            late = ticket.fired
        if late:
            _shut(sock)

    def disarm(self, ticket: _Ticket) -> None:
        with self._cond:
            ticket.done = True
            ticket.sock = None

    def abort_all(self) -> None:
        """Fire every armed ticket now (the process is stopping)."""
        with self._cond:
            for ticket in self._heap:
                ticket.deadline = 0.0
                ticket.aborted = True
            heapq.heapify(self._heap)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0].done:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0].deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                ticket = heapq.heappop(self._heap)
                ticket.fired = True
                sock = ticket.sock
            if sock is not None:
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    # The plain socket's shutdown, also for a TLS socket: it ends a read in progress in
    # another thread without touching the TLS state that thread is using. OSError: not
    # connected yet, or already closed (the socket timeout covers those).
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


WATCHDOG = Watchdog()


def abort_all() -> None:
    """End every poll in flight (used on SIGTERM)."""
    WATCHDOG.abort_all()


class Fetcher:
    """Fetches one target's page, one connection per poll (closed after it, so nothing is held
    between polls); safe to call from one thread at a time."""

    def __init__(self, target: TargetConfig, user_agent: str) -> None:
        self.target = target
        self.user_agent = user_agent
        self._ssl: ssl.SSLContext | None = None

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            ctx = ssl.create_default_context(cafile=self.target.ca_file or None)
            if not self.target.tls_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            self._ssl = ctx
        return self._ssl

    def _auth_header(self, url: str) -> str | None:
        path = self.target.bearer_token_file
        if path:
            try:
                # Read on every poll, as Prometheus does, so a rotated token is picked up.
                with open(path, encoding="utf-8") as fh:
                    token = fh.read(64 * 1024).strip()
            except OSError as exc:
                raise PageError("connect", "cannot read the bearer token file: "
                                           f"{exc.strerror}") from exc
            return f"Bearer {token}"
        parts = urlsplit(url)
        if parts.username is not None:
            raw = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            return "Basic " + base64.b64encode(raw).decode()
        return None

    def fetch(self) -> str:
        """The page's text, or PageError with one of the catalog's reasons; Aborted when the
        process stopping cut the poll off (that is no timeout of the target's)."""
        timeout = self.target.timeout
        deadline = time.monotonic() + timeout
        ticket = WATCHDOG.arm(deadline)
        try:
            body = self._exchange(ticket, deadline)
        except (PageError, OSError, http.client.HTTPException) as exc:
            if ticket.aborted:
                raise Aborted() from exc
            if ticket.fired or isinstance(exc, TimeoutError):  # whatever the cut read raised
                raise PageError("timeout", f"no complete answer within {timeout:g}s") from exc
            raise _page_error(exc) from exc
        finally:
            WATCHDOG.disarm(ticket)
        if ticket.aborted:
            raise Aborted()
        if ticket.fired:  # a cut-off read can look like a clean end: never trust it
            raise PageError("timeout", f"no complete answer within {timeout:g}s")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PageError("parse", "body is not UTF-8 text") from exc

    def _exchange(self, ticket: _Ticket, deadline: float) -> bytes:
        url = self.target.url
        origin = _origin(url)
        auth = self._auth_header(url)
        for _hop in range(MAX_REDIRECTS + 1):
            if _origin(url) != origin:
                auth = None  # never hand a credential to another host (as requests does)
            status, location, body = self._one(url, auth, ticket, deadline)
            if status in _REDIRECTS and location:
                url = urljoin(url, location)
                if urlsplit(url).scheme not in ("http", "https"):
                    raise PageError("http_status", f"HTTP {status} to a non-HTTP location")
                continue
            return body
        raise PageError("http_status", f"more than {MAX_REDIRECTS} redirects")

    def _one(self, url: str, auth: str | None, ticket: _Ticket, deadline: float
             ) -> tuple[int, str | None, bytes]:
        parts = urlsplit(url)
        https = parts.scheme == "https"
        host = parts.hostname or ""
        port = parts.port or (443 if https else 80)
        sock = _connect(host, port, deadline)
        try:
            WATCHDOG.watch(ticket, sock)
            if https:
                sock.settimeout(_left(deadline))
                sock = self._ssl_context().wrap_socket(sock, server_hostname=host)
                WATCHDOG.watch(ticket, sock)
            conn = http.client.HTTPConnection(host, port)
            conn.sock = sock
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            sock.settimeout(_left(deadline))
            conn.putrequest("GET", path, skip_accept_encoding=True)
            conn.putheader("Accept", ACCEPT)
            conn.putheader("Accept-Encoding", "gzip")
            conn.putheader("User-Agent", self.user_agent)
            conn.putheader("Connection", "close")
            if auth:
                conn.putheader("Authorization", auth)
            conn.endheaders()
            sock.settimeout(_left(deadline))
            resp = conn.getresponse()
            if resp.status in _REDIRECTS:
                return resp.status, resp.getheader("Location"), b""
            if resp.status != 200:
                raise PageError("http_status", f"HTTP {resp.status} {resp.reason[:80]}")
            ctype = (resp.getheader("Content-Type") or "").lower()
            if ctype.startswith(("text/html", "application/json", "application/xml")):
                raise PageError("not_metrics", f"Content-Type {ctype[:80]!r} is not a metrics "
                                               "page")
            return 200, None, self._body(resp, sock, deadline)
        finally:
            sock.close()

    def _body(self, resp: http.client.HTTPResponse, sock: socket.socket, deadline: float
              ) -> bytes:
        cap = self.target.max_body_bytes
        declared = resp.getheader("Content-Length") or ""
        encoding = (resp.getheader("Content-Encoding") or "").strip().lower()
        if declared.isdigit() and int(declared) > cap and encoding in ("", "identity"):
            raise PageError("too_large", f"body of {declared} bytes is over the cap of {cap}")
        inflate = None
        if encoding in ("gzip", "x-gzip", "deflate"):
            inflate = zlib.decompressobj(47 if "gzip" in encoding else zlib.MAX_WBITS)
        elif encoding not in ("", "identity"):
            raise PageError("parse", f"unknown Content-Encoding {encoding[:40]!r}")
        chunks: list[bytes] = []
        size = 0
        received = 0
        while True:
            sock.settimeout(_left(deadline))
            raw = resp.read1(_CHUNK)
            if not raw:
                break
            received += len(raw)
            if inflate is not None:
                # Never inflate more than the cap allows: a gzip bomb stops at cap + 1 bytes.
                raw = inflate.decompress(raw, cap + 1 - size)
            size += len(raw)
            if size > cap:
                raise PageError("too_large", f"body passed the cap of {cap} bytes")
            chunks.append(raw)
            if time.monotonic() > deadline:
                raise TimeoutError
        if declared.isdigit() and received < int(declared):
            raise PageError("parse", f"body cut short: {received} of {declared} bytes")
        if inflate is not None and not inflate.eof:
            raise PageError("parse", "compressed body cut short")
        return b"".join(chunks)


def _page_error(exc: Exception) -> PageError:
    """The catalog's reason for what an exchange raised (before its deadline)."""
    if isinstance(exc, PageError):
        return exc
    if isinstance(exc, ssl.SSLError):
        return PageError("tls", f"TLS: {exc.reason or type(exc).__name__}")
    if isinstance(exc, http.client.IncompleteRead):
        return PageError("parse", "body cut short")
    if not isinstance(exc, OSError):  # RemoteDisconnected is one: the peer hung up
        return PageError("parse", f"malformed HTTP answer: {type(exc).__name__}")
    return PageError("connect", _short(exc))


def _connect(host: str, port: int, deadline: float) -> socket.socket:
    """A TCP connection made within the deadline (every address tried shares it)."""
    last: OSError | None = None
    for family, kind, proto, _name, addr in socket.getaddrinfo(host, port,
                                                               type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(_left(deadline))
            sock.connect(addr)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
            if isinstance(exc, TimeoutError):
                raise
    raise last or OSError(f"no address for {host}")


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or ""), parts.port


def _short(exc: BaseException) -> str:
    """A short reason, without any URL (the URL may carry a credential)."""
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "timed out",
                   "certificate verify failed", "Connection reset", "Remote end closed",
                   "No route to host", "Network is unreachable",
                   "Temporary failure in name resolution"):
        if marker.lower() in text.lower():
            return marker
    return type(exc).__name__
