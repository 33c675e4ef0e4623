"""`prefixwatch exporter --requests-log PATH [--follow]`: feed a request log to the view.

Reads the JSONL forms `prefixwatch audit` reads and vLLM's own request log lines, in a thread
of its own so a slow tokenizer never delays polling. With ``--follow`` it behaves like
``tail -F``: it starts at the end of the file (after warming the window from its last few
megabytes), waits for new lines, holds a partial last line until it is complete, and reopens
the file when it is rotated or truncated. A bad line is counted and skipped, never fatal; a
line longer than ``MAX_LINE_BYTES`` is skipped without being held in memory.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prefixwatch.core.logs.formats import (
    MAX_LINE_BYTES,
    BadLine,
    LogRequest,
    VllmLogJoiner,
    parse_line,
)
from prefixwatch.core.logs.tokenizers import (
    AuditError,
    NoTokenizer,
    ServerTokenizer,
    Tokenizer,
    open_tokenizer,
)
from prefixwatch.core.vocab import exposition
from prefixwatch.exporter.requestlog.view import RequestView

log = logging.getLogger("prefixwatch.requests")

WARM_BYTES = 4 * 1024 * 1024
BATCH = 64
RETRY_TOKENIZER_SECONDS = 30.0


@dataclass(frozen=True)
class RequestsLogConfig:
    path: str
    follow: bool = False
    #: "server" (the first target's /tokenize), a URL, a tokenizer directory, "builtin", "none".
    tokenizer: str = "server"
    max_log_len: int | None = None
    #: The model the log belongs to; None: every model the targets serve.
    model: str | None = None
    max_requests: int = exposition.REQUESTS_WINDOW_REQUESTS
    max_blocks: int = exposition.REQUESTS_WINDOW_BLOCKS
    #: Every request of this log was served by this replica (a per-target log); None: the
    #: log's own ``replica`` field, if any.
    replica: str | None = None


def make_tokenizer(spec: str, first_target: str | None) -> tuple[Tokenizer, Callable | None]:
    """A tokenizer for text requests and a strict decoder for divergence kinds (None: none)."""
    if spec == "server" or spec.startswith(("http://", "https://")):
        url = first_target if spec == "server" else spec
        if url is None:
            raise AuditError("no target to tokenize with")
        tok = open_tokenizer(server=url)
    else:
        tok = open_tokenizer(directory=None if spec == "none" else spec)
    if isinstance(tok, NoTokenizer):
        return tok, None
    if isinstance(tok, ServerTokenizer):
        return tok, functools.partial(tok.decode, strict=True)
    return tok, tok.decode


class RequestsLogReader:
    """The thread that reads the log into a RequestView."""

    def __init__(self, config: RequestsLogConfig, view: RequestView,
                 first_target: str | None = None, poll_seconds: float = 0.25) -> None:
        self.config = config
        self.view = view
        self.first_target = first_target
        self.poll_seconds = poll_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="requests-log", daemon=True)
        self._tokenizer: Tokenizer | None = None
        self._tokenizer_error: str | None = None
        self._tokenizer_retry_at = 0.0
        self._joiner = VllmLogJoiner(config.max_log_len)
        self._partial = b""  # a line whose end has not been written yet
        self._line_no = 0
        self._skipping_long = False  # inside a line longer than MAX_LINE_BYTES
        self._warned: set[str] = set()
        self._warming = False  # reading history before following: fill the index only
        self.done = threading.Event()  # set when a non-follow read reached the end

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started (the exporter may stop before that)
            self._thread.join(timeout=5)

    # -- tokenizer -----------------------------------------------------------------------------

    def _tokenize(self, batch: Sequence[LogRequest]) -> list[Sequence[int] | str]:
        if all(r.token_ids is not None for r in batch):
            return [r.token_ids or () for r in batch]
        now = time.monotonic()
        if self._tokenizer is None and now >= self._tokenizer_retry_at:
            try:
                self._tokenizer, self.view.decoder = make_tokenizer(
                    self.config.tokenizer, self.first_target)
                if self._tokenizer_error:
                    log.info("requests log: tokenizer %s is available again",
                             self.config.tokenizer)
                self._tokenizer_error = None
            except AuditError as exc:
                if self._tokenizer_error != str(exc):
                    log.warning("requests log: no tokenizer (%s); text requests are skipped "
                                "until it answers", exc)
                self._tokenizer_error = str(exc)
                self._tokenizer_retry_at = now + RETRY_TOKENIZER_SECONDS
        if self._tokenizer is None:
            reason = f"no tokenizer: {self._tokenizer_error}"
            return [r.token_ids if r.token_ids is not None else reason for r in batch]
        try:
            return self._tokenizer.tokenize(batch)
        except AuditError as exc:  # the server went away mid-batch
            log.warning("requests log: tokenizer failed (%s); retrying later", exc)
            self._tokenizer, self._tokenizer_error = None, str(exc)
            self._tokenizer_retry_at = now + RETRY_TOKENIZER_SECONDS
            return [r.token_ids if r.token_ids is not None else f"tokenizer failed: {exc}"
                    for r in batch]

    def _ensure_decoder(self) -> None:
        """Token-id-only logs still need a decoder for the kinds: try to get one (again every
        RETRY_TOKENIZER_SECONDS while the server does not answer)."""
        if (self.view.decoder is None and self._tokenizer is None
                and self.config.tokenizer != "none"):
            now = time.monotonic()
            if now >= self._tokenizer_retry_at:
                try:
                    self._tokenizer, self.view.decoder = make_tokenizer(
                        self.config.tokenizer, self.first_target)
                except AuditError as exc:
                    self._tokenizer_error = str(exc)
                    self._tokenizer_retry_at = now + RETRY_TOKENIZER_SECONDS

    # -- feeding -------------------------------------------------------------------------------

    def feed_lines(self, lines: Sequence[str | bytes], where: str, first_number: int) -> None:
        """Parse, tokenize and add a run of consecutive complete lines (text, or the bytes
        read: JSON lines are decoded from them directly)."""
        self._feed((f"{where}:{first_number + i}", line) for i, line in enumerate(lines))

    def _feed(self, numbered: Iterable[tuple[str, str | bytes]]) -> None:
        pending: list[LogRequest] = []
        for where, line in numbered:
            found = parse_line(line, where, self._joiner)
            if not found:
                if not self._warming:
                    self.view.count("other")
                continue
            for item in found:
                if isinstance(item, BadLine):
                    self._skip(item.where, item.reason)
                else:
                    pending.append(item)
            if len(pending) >= BATCH:
                self._add(pending)
                pending = []
        self._add(pending)

    def flush(self) -> None:
        self._add(self._joiner.flush())

    def _add(self, batch: list[LogRequest]) -> None:
        if not batch:
            return
        self._ensure_decoder()
        for req, ids in zip(batch, self._tokenize(batch), strict=True):
            if isinstance(ids, str):
                self._skip(req.where, ids)
                continue
            try:
                self.view.add(ids, req.extra_keys, req.truncated, warm=self._warming,
                              replica=req.replica or self.config.replica,
                              cached=req.cached_tokens, output=req.max_tokens)
            except OverflowError:
                self._skip(req.where, "token id out of range")

    def _skip(self, where: str, reason: str) -> None:
        """Count a bad line; say so once per kind of problem, then only at debug level."""
        if self._warming:
            return
        self.view.count("skipped")
        kind = reason.split(":", 1)[0][:60]
        if kind not in self._warned and len(self._warned) < 32:
            self._warned.add(kind)
            log.warning("requests log: %s: skipped: %s (further lines like it are counted in "
                        "prefixwatch_requests_log_lines_total{result=\"skipped\"})", where, reason)
        else:
            log.debug("requests log: %s: skipped: %s", where, reason)

    # -- the file ------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.config.follow:
                self._follow()
            else:
                self._read_once()
        except Exception:  # pragma: no cover - the exporter must keep polling
            log.exception("requests log reader stopped")
        finally:
            self.done.set()

    def _read_once(self) -> None:
        path = self.config.path
        try:
            with open(path, "rb") as fh:
                self._consume(fh, path, final=True)
        except OSError as exc:
            log.error("requests log %s: %s", path, exc.strerror)
        self.flush()
        log.info("requests log %s read: %s", path, self._summary())

    def _summary(self) -> str:
        lines = self.view.lines
        return ", ".join(f"{n} {k}" for k, n in lines.items())

    def _follow(self) -> None:
        path = self.config.path
        fh = None
        ident: tuple[int, int] | None = None
        opened_before = False
        missing_logged = False
        last_data = time.monotonic()
        while not self._stop.is_set():
            if fh is None:
                try:
                    fh = open(path, "rb")  # noqa: SIM115 - held across iterations
                except OSError as exc:
                    if not missing_logged:
                        log.warning("requests log %s: %s; waiting for it", path, exc.strerror)
                        missing_logged = True
                    self._stop.wait(1.0)
                    continue
                missing_logged = False
                st = os.fstat(fh.fileno())
                ident = (st.st_dev, st.st_ino)
                if not opened_before:
                    self._warm(fh, st.st_size)  # then follow from the end, as tail -F
                opened_before = True
                log.info("requests log %s: following from byte %d", path, fh.tell())
            if self._consume(fh, path, final=False):
                last_data = time.monotonic()
                continue
            if time.monotonic() - last_data > 1.0:
                self.flush()  # DEBUG halves whose INFO line never came
            try:
                st = os.stat(path)
                rotated = (st.st_dev, st.st_ino) != ident or st.st_size < fh.tell()
            except OSError:
                rotated = True
            if rotated:
                self._consume(fh, path, final=True)  # what the old file still had
                fh.close()
                fh = None
                self._line_no = 0
                self._skipping_long = False
                log.info("requests log %s was rotated or truncated: reopening", path)
                continue
            self._stop.wait(self.poll_seconds)
        if fh is not None:
            fh.close()

    def _warm(self, fh, size: int) -> None:  # noqa: ANN001
        """Fill the window from the end of the existing file, so the first new requests are
        compared with recent history instead of an empty cache."""
        start = max(0, size - WARM_BYTES)
        fh.seek(start)
        if start:
            fh.readline()  # a partial first line
        data = fh.read(size - fh.tell())
        lines = data.splitlines()
        if lines and not data.endswith(b"\n"):
            lines.pop()
            fh.seek(size - len(data.rsplit(b"\n", 1)[-1]))
        self._warming = True
        try:
            self.feed_lines(lines, self.config.path, 0)
            self.flush()
        finally:
            self._warming = False

    def _consume(self, fh, where: str, final: bool) -> bool:  # noqa: ANN001
        """Read what is there; complete lines are fed, a partial last line waits (unless
        ``final``). Returns whether anything was read."""
        got = False
        while True:
            chunk = fh.read(1 << 20)
            if not chunk:
                break
            got = True
            data = self._partial + chunk
            self._partial = b""
            parts = data.split(b"\n")
            tail = parts.pop()
            numbered = []
            for raw in parts:
                self._line_no += 1
                if self._skipping_long:
                    self._skipping_long = False  # the end of an over-long line
                    continue
                if len(raw) > MAX_LINE_BYTES:
                    self._skip(f"{where}:{self._line_no}", "line too long")
                    continue
                numbered.append((f"{where}:{self._line_no}", raw))
            self._feed(numbered)
            if len(tail) > MAX_LINE_BYTES:
                if not self._skipping_long:
                    self._skip(f"{where}:{self._line_no + 1}", "line too long")
                self._skipping_long = True  # drop the rest of it as it comes
            elif not self._skipping_long:
                self._partial = tail
        if final and self._partial:
            self._line_no += 1
            self._feed([(f"{where}:{self._line_no}", self._partial)])
            self._partial = b""
        return got
