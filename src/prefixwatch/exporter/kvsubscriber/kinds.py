"""What varies where new chains diverge: the target's /detokenize names it (as the request
view does), in a thread of its own so a slow tokenizer never delays a stream or a poll.

Each source's mirror keeps the tokens on both sides of its recent divergences (a bounded
queue); once a second they are decoded and named (``core.whatvaries.guess_kind``) and counted
in ``prefixwatch_kv_divergences_total{kind}``, the newest first, for at most NAME_SECONDS a
target (the rest of the round ``unknown``). Where each request's own content starts is known
from the position alone and asks no tokenizer. Without a tokenizer (the target answers no
/detokenize) the kind is ``unknown``; the tokenizer is asked for again every 30 s.

A named divergence is kept for the culprit at the token where its value starts
(``core.whatvaries.value_start``, from each token's text before it, decoded one token at a
time through a bounded cache), so a timestamp is one culprit whichever digit two requests
parted at.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable

from prefixwatch.core.cache.whatvaries import (
    OWN_CONTENT,
    OWN_CONTENT_SHARE,
    guess_kind,
    one_token_reader,
    value_start,
)
from prefixwatch.core.kv.counts import Divergence
from prefixwatch.core.logs.tokenizers import AuditError, ServerTokenizer
from prefixwatch.exporter.kvsubscriber.source import KvSource

log = logging.getLogger("prefixwatch.exporter.kvsubscriber")

RETRY_SECONDS = 30.0
#: Each round names, per target, the newest divergences for at most this long (three calls to
#: the target's /detokenize each, and one per token read back to where a value starts, until
#: it is cached); the older ones of the round are counted ``unknown``. So a busy or slow
#: target's tokenizer never delays another target's names, and the culprit is read from the
#: newest divergences, however far behind the stream the namer would fall.
NAME_SECONDS = 0.25
TOKENIZER_TIMEOUT = 3.0
UNKNOWN = "unknown"

Decoder = Callable[[list[int]], str]


def recent_divergences(sources: Iterable[KvSource], since: float
                       ) -> dict[str, Counter[tuple[str, int]]]:
    """The named divergences of ``sources`` since ``since`` (a time.time() value), per model,
    counted by (kind, token position): what the culprit is chosen from."""
    out: dict[str, Counter[tuple[str, int]]] = {}
    for source in sources:
        with source.lock:
            named = [(model, kind, position) for at, model, kind, position in source.named
                     if at >= since]
        for model, kind, position in named:
            out.setdefault(model, Counter())[(kind, position)] += 1
    return out


def classify(div: Divergence, decode: Decoder | None) -> str:
    """The kind of one divergence: where each request's own content starts by its position
    alone (no tokenizer asked); else from its decoded text (three calls to the tokenizer);
    ``unknown`` without a decoder or when it fails."""
    shared = div.position / div.chain_tokens if div.chain_tokens else None
    if shared is not None and shared >= OWN_CONTENT_SHARE:
        return OWN_CONTENT
    if decode is None:
        return UNKNOWN
    try:
        before, mine, theirs = decode(div.before), decode(div.mine), decode(div.theirs)
    except Exception:  # a tokenizer failing is not the stream's fault
        return UNKNOWN
    return guess_kind(mine, theirs, before, shared)


def culprit_position(div: Divergence, kind: str,
                     piece: Callable[[int], str] | None) -> int | None:
    """The token where the value that varies at ``div`` starts (``div.position`` when the
    kind names no value); None without a decoder or when it fails, when the start is not
    known (a busy tokenizer must not move the culprit to where two requests parted)."""
    if piece is None:
        return None
    try:
        back = value_start(kind, div.before, piece)
    except Exception:  # a tokenizer failing is not the stream's fault
        return None
    return div.position - back


class KindNamer:
    """Names the divergences of every source, once a second, until stopped."""

    def __init__(self, sources: dict[str, KvSource], urls: dict[str, str],
                 stop: threading.Event, interval: float = 1.0) -> None:
        self.sources = sources
        self.urls = urls  # target -> its /metrics URL (the tokenizer's base)
        self.stop = stop
        self.interval = interval
        self._decoders: dict[str, tuple[float, Decoder | None]] = {}
        self._pieces: dict[str, Callable[[int], str]] = {}
        self.thread = threading.Thread(target=self.run, name="kv-kinds", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def decoder(self, target: str) -> Decoder | None:
        at, decode = self._decoders.get(target, (-RETRY_SECONDS, None))
        if decode is None and time.monotonic() - at >= RETRY_SECONDS and target in self.urls:
            try:
                tok = ServerTokenizer(self.urls[target], concurrency=1,
                                      timeout=TOKENIZER_TIMEOUT)
                decode = lambda ids, t=tok: t.decode(ids, strict=True)  # noqa: E731
                log.info("kv events of %s: divergence kinds from its /detokenize", target)
            except AuditError as exc:
                log.debug("kv events of %s: no tokenizer (%s)", target, exc)
            self._decoders[target] = (time.monotonic(), decode)
            if decode is not None:
                self._pieces[target] = one_token_reader(decode)
        return decode

    def name_once(self) -> None:
        for target, source in self.sources.items():
            mirror = source.mirror
            if mirror is None or self.stop.is_set():
                continue
            pending, dropped = mirror.take_divergences(), mirror.take_dropped_divergences()
            if dropped:
                with source.lock:
                    source.kinds[UNKNOWN] = source.kinds.get(UNKNOWN, 0) + dropped
            if not pending:
                continue
            decode = self.decoder(target)
            piece = self._pieces.get(target) if decode is not None else None
            named = self._name(pending, decode, piece)
            placeholders = mirror.fleet.placeholder_roots
            with source.lock:
                for div, kind, position in named:
                    source.kinds[kind] = source.kinds.get(kind, 0) + 1
                    # A position known: read back to its value, under a chain seen from its
                    # root (a placeholder's depth is unknown).
                    if position is not None and div.root not in placeholders:
                        source.named.append((time.time(), mirror.fleet.model, kind, position))

    def _name(self, pending: list[Divergence], decode: Decoder | None,
              piece: Callable[[int], str] | None) -> list[tuple[Divergence, str, int | None]]:
        """Each divergence with its kind and culprit position (None: not known), the newest
        named first for NAME_SECONDS; the rest ``unknown``."""
        deadline = time.monotonic() + NAME_SECONDS
        out: list[tuple[Divergence, str, int | None]] = []
        for div in reversed(pending):
            if self.stop.is_set() or time.monotonic() > deadline:
                out.append((div, UNKNOWN, None))
                continue
            kind = classify(div, decode)
            out.append((div, kind, culprit_position(div, kind, piece)))
        return out

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            try:
                self.name_once()
            except Exception:  # a bug here must not end the streams
                log.exception("kv events: naming divergences failed")
