"""The one story every surface tells about an incident, in the same words.

The page, `status`, the landing page, the report and the demo's terminal each show the hit
ratio, the window it is over, the cause and the culprit. They read them from here, so that for
one incident they say the same thing the same way: a percentage to one decimal, a window by
its length, a cause only if it held when the ratio dropped, and the culprit as a person says
it ("a date/time at token 10 of the prompt changes on every request"), never as the ledger's
jargon.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prefixwatch.core.vocab.settings import HIT_RATIO_DEVICE

#: Kinds that name no culprit: where each request's own content starts is no problem to fix,
#: and an undecoded divergence says nothing about what varies.
NOT_CULPRITS = ("own content", "unknown", "token ids")
#: A kind behind at least this share of the early divergences "changes on every request"
#: (the rest are requests whose neighbour happened to share more, or noise).
EVERY_REQUEST = 0.5
#: A kind named fewer times than this in the window is no culprit yet: the first request of a
#: new prompt parts from the old one once (a deploy's first request, 'text' where the new line
#: starts), which is not what changes on every request after it.
MIN_DIVERGENCES = 3
#: The label of the culprit series whose value is the sentence itself.
CULPRIT_WORDS_LABEL = "culprit"


def ratio_name(mode: str) -> str:
    """How every surface names the ratio that pages: 'effective hit ratio' (every cache tier)
    or 'device hit ratio' (the ``hit_ratio`` setting)."""
    return "device hit ratio" if mode == HIT_RATIO_DEVICE else "effective hit ratio"


def percent(value: float | None) -> str:
    """A ratio as a percentage to one decimal ('0.8%'); '-' when undefined (no traffic)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value * 100:.1f}%"


def window_words(seconds: float) -> str:
    """A window by its length, the way Prometheus writes it ('6s', '2m', '1h30m')."""
    ms = round(seconds * 1000)
    if ms <= 0:
        return "0s"
    out = ""
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        if ms >= size:
            out += f"{ms // size}{unit}"
            ms %= size
    return out


@dataclass(frozen=True)
class Culprit:
    """What varies early in the prompts: its kind, the token where requests most often
    part, and the share of the early divergences it accounts for."""

    kind: str
    position: int
    share: float
    #: The last token where requests part over it, when a whole log is told (the audit):
    #: 'at tokens 19-21'.
    last: int | None = None

    @property
    def words(self) -> str:
        often = ("changes on every request" if self.share >= EVERY_REQUEST
                 else "changes on some requests")
        article = "an" if self.kind[:1] in "aeiou" else "a"
        where = (f"tokens {self.position}-{self.last}"
                 if self.last is not None and self.last != self.position
                 else f"token {self.position}")
        return f"{article} {self.kind} at {where} of the prompt {often}"


def culprit_of(divergences: Mapping[tuple[str, int], int] | Iterable[tuple[str, int]]
               ) -> Culprit | None:
    """The culprit of a window's early divergences, given as (kind, position) with their
    counts: the most frequent kind that names one, at its most frequent position (the
    earliest on a tie). None when no kind is named at least MIN_DIVERGENCES times."""
    counts: Counter[tuple[str, int]] = Counter()
    if isinstance(divergences, Mapping):
        counts.update(divergences)
    else:
        counts.update(divergences)
    kinds: Counter[str] = Counter()
    for (kind, _position), n in counts.items():
        if kind not in NOT_CULPRITS and n > 0:
            kinds[kind] += n
    if not kinds or max(kinds.values()) < MIN_DIVERGENCES:
        return None
    top = max(kinds, key=lambda k: (kinds[k], -min(p for (kk, p) in counts if kk == k)))
    positions = {p: n for (k, p), n in counts.items() if k == top}
    position = max(positions, key=lambda p: (positions[p], -p))
    early = sum(kinds.values())
    return Culprit(top, position, kinds[top] / early)


def root_causes(spans: Mapping[str, Iterable[tuple[float, float | None]]],
                drop_at: float | None) -> list[str]:
    """The causes that held when the ratio dropped or after (a cause whose every span ended
    before the drop, a cold start say, is not the root cause), longest-held first.
    ``spans``: cause -> (start, end) intervals, end None while it still holds."""
    held: dict[str, float] = {}
    for cause, intervals in spans.items():
        for start, end in intervals:
            if drop_at is not None and end is not None and end < drop_at:
                continue
            last = math.inf if end is None else end
            held[cause] = held.get(cause, 0.0) + (last - max(start, drop_at or start))
    return sorted(held, key=lambda c: (-held[c], c))


def headline(ratio_name: str, ratio: float | None, window: str, causes: Iterable[str],
             culprit: Culprit | str | None) -> str:
    """The story in one line: '<ratio name> 0.8% over 6s; cause: prefix_divergence;
    culprit: a date/time at token 21 of the prompt changes on every request'."""
    named = ", ".join(causes) or "none diagnosed"
    line = f"{ratio_name} {percent(ratio)} over {window}; cause: {named}"
    words = culprit.words if isinstance(culprit, Culprit) else culprit
    return line + (f"; culprit: {words}" if words else "")
