"""How every prefixwatch HTTP server writes an answer: one request handler base whose
``_send`` sets the status, Content-Type and Content-Length and writes the body (none to a
HEAD request). The exporter's and the simulator's handlers build on it, so an answer is
framed the same way everywhere."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler


class ReplyHandler(BaseHTTPRequestHandler):
    """A request handler that answers with a whole body of known length."""

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
