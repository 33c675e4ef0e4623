"""The exporter's HTTP server, bounded: a listen backlog, a fixed pool of worker threads and
one deadline per connection, so slow or numerous clients cannot exhaust the process.

``http.server.ThreadingHTTPServer`` starts a thread per connection and never times one out:
1,000 half-sent requests hold 1,000 threads. Here a connection is handed to one of
``workers`` threads through a bounded queue (a full queue closes the newcomer), and the poll
watchdog shuts its socket once ``REQUEST_DEADLINE`` has passed, however slowly it trickles.
"""

from __future__ import annotations

import logging
import queue
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

from prefixwatch.exporter.scrape import WATCHDOG

log = logging.getLogger("prefixwatch.exporter")

#: Seconds one connection may take, from accept to the last byte of the answer.
REQUEST_DEADLINE = 10.0
#: Seconds a single read or write may wait (the handler's socket timeout).
READ_TIMEOUT = 5.0
LISTEN_BACKLOG = 128
WORKERS = 16
QUEUE_SIZE = 64


class BoundedHTTPServer(HTTPServer):
    """An HTTPServer with a fixed worker pool, a per-connection deadline and optional TLS."""

    request_queue_size = LISTEN_BACKLOG
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 ssl_context: ssl.SSLContext | None = None, workers: int = WORKERS,
                 queue_size: int = QUEUE_SIZE, deadline: float = REQUEST_DEADLINE) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        # Before binding: a failed bind calls server_close(), which must find these.
        self._queue: queue.Queue[tuple[socket.socket, object, float] | None] = queue.Queue(
            queue_size)
        self._workers: list[threading.Thread] = []
        super().__init__(address, handler)
        self.ssl_context = ssl_context
        self.deadline = deadline
        self._workers = [threading.Thread(target=self._work, name=f"http-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._workers:
            thread.start()

    def process_request(self, request, client_address) -> None:  # noqa: ANN001
        try:
            self._queue.put_nowait((request, client_address, time.monotonic() + self.deadline))
        except queue.Full:
            log.debug("http: %d connections waiting; closing a new one", self._queue.qsize())
            self.shutdown_request(request)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            request, client_address, deadline = item
            ticket = WATCHDOG.arm(deadline)
            try:
                WATCHDOG.watch(ticket, request)
                if self.ssl_context is not None:
                    request.settimeout(READ_TIMEOUT)
                    request = self.ssl_context.wrap_socket(request, server_side=True)
                    WATCHDOG.watch(ticket, request)
                self.finish_request(request, client_address)
            except (OSError, ssl.SSLError):
                pass  # the client went away, spoke no TLS, or ran out of time
            except Exception:
                self.handle_error(request, client_address)
            finally:
                WATCHDOG.disarm(ticket)
                self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        for _ in self._workers:
            try:
                self._queue.put_nowait(None)
            except queue.Full:
                break  # daemon threads: they end with the process
