"""How the demo ends: every part it started is stopped at once, under one deadline, and an
interrupted incident report gives way to a second Ctrl-C or a SIGTERM.

The parts (simulator, exporter, page printer, Prometheus and Alertmanager) stop each in its
own thread, so the whole takes as long as the slowest part, not their sum; a part may wait for
another to have stopped first (the simulator for the exporter). A part still stopping at the
deadline is logged by name and left behind (its threads are daemons; child processes are
killed), so the process ends within ``STOP_WITHIN`` seconds of the signal whatever the
machine's load.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

log = logging.getLogger("prefixwatch.demo")

#: Seconds from the start of the shutdown to the last part stopped or given up on: SIGTERM
#: ends the process within 2 s, including the interpreter's own exit.
STOP_WITHIN = 1.5


class Skipped(Exception):
    """A second Ctrl-C or a SIGTERM arrived while the incident report was being written."""


@dataclass
class _Part:
    name: str
    stop: Callable[[float], None]
    after: str | None
    done: threading.Event = field(default_factory=threading.Event)


class Shutdown:
    """The demo's parts in the order they started; ``stop_all`` stops them together.
    Registered as the one cleanup of the demo's ExitStack, so a failed start stops what
    had started, as a signal does."""

    def __init__(self, within: float = STOP_WITHIN) -> None:
        self.within = within
        self._parts: list[_Part] = []

    def add(self, name: str, stop: Callable[[], None], after: str | None = None) -> None:
        """A part whose stop takes no deadline (it bounds itself). ``after`` names a part
        that must have stopped first (waited for until the deadline): the simulator after
        the exporter, so that the exporter does not see its engines vanish and warn."""
        self._parts.append(_Part(name, lambda _deadline: stop(), after))

    def add_with_deadline(self, name: str, stop: Callable[[float], None]) -> None:
        """A part whose stop takes the shared deadline, a ``time.monotonic()`` value."""
        self._parts.append(_Part(name, stop, None))

    def stop_all(self) -> list[str]:
        """Stop every part at once; return the names of those still stopping at the
        deadline (also logged)."""
        deadline = time.monotonic() + self.within
        by_name = {part.name: part for part in self._parts}
        threads = []
        for part in self._parts:
            first = by_name.get(part.after) if part.after else None
            thread = threading.Thread(target=_stop_one, args=(part, first, deadline),
                                      name=f"stop-{part.name}", daemon=True)
            thread.start()
            threads.append((part.name, thread))
        late = []
        for name, thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                late.append(name)
        if late:
            log.warning("still stopping after %.1fs, left behind: %s", self.within,
                        ", ".join(late))
        self._parts.clear()
        return late


def _stop_one(part: _Part, first: _Part | None, deadline: float) -> None:
    try:
        if first is not None:
            first.done.wait(max(0.0, deadline - time.monotonic()))
        part.stop(deadline)
    except Exception as exc:  # noqa: BLE001 - one part's failure must not keep the rest running
        log.warning("stopping %s failed: %s", part.name, exc)
    finally:
        part.done.set()


@contextlib.contextmanager
def skippable() -> Iterator[None]:
    """Inside the block, SIGINT or SIGTERM raises :class:`Skipped` in the main thread (where
    Python runs signal handlers), so a slow step after the first Ctrl-C can be cut short; the
    previous handlers are restored after it."""

    def handler(signum: int, _frame: object) -> None:
        raise Skipped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler)
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
