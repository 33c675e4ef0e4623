"""How the demo ends: its parts stop together under one deadline, a part that fails or hangs
does not keep the rest running, a child that ignores SIGTERM is killed, and a second signal cuts
the incident report short. No assertion on elapsed time: each check is on what happened."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from prefixwatch.demo.backends import Backends
from prefixwatch.demo.shutdown import Shutdown, Skipped, skippable


def test_parts_stop_together() -> None:
    """Each part waits for the other to have begun stopping: only concurrent stops finish."""
    began = [threading.Event(), threading.Event()]
    stopped: list[int] = []

    def stop(i: int) -> None:
        began[i].set()
        assert began[1 - i].wait(5), "the other part had not begun stopping"
        stopped.append(i)

    parts = Shutdown(within=10)
    parts.add("a", lambda: stop(0))
    parts.add("b", lambda: stop(1))
    assert parts.stop_all() == []
    assert sorted(stopped) == [0, 1]


def test_a_hung_or_failing_part_does_not_hold_the_others(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    release = threading.Event()
    stopped = []
    parts = Shutdown(within=0.3)
    parts.add("the stuck one", release.wait)
    parts.add("the failing one", lambda: 1 / 0)
    parts.add("the good one", lambda: stopped.append("good"))
    with caplog.at_level(logging.WARNING, "prefixwatch.demo"):
        late = parts.stop_all()
    release.set()
    assert late == ["the stuck one"]
    assert stopped == ["good"]
    assert "left behind: the stuck one" in caplog.text
    assert "stopping the failing one failed: division by zero" in caplog.text


def test_the_deadline_reaches_the_parts_that_take_it() -> None:
    seen: list[float] = []
    parts = Shutdown(within=5)
    before = time.monotonic()
    parts.add_with_deadline("p", seen.append)
    parts.stop_all()
    assert before + 5 <= seen[0] <= time.monotonic() + 5


def test_a_child_that_ignores_sigterm_is_killed_at_the_deadline(tmp_path: Path) -> None:
    backends = Backends(tmp_path, 0, 0, 0, 1.0)
    ready = tmp_path / "ready"
    log_file = open(tmp_path / "child.log", "ab")  # noqa: SIM115 - closed by stop()
    child = subprocess.Popen(
        [sys.executable, "-c", "import pathlib, signal, sys, time; "
         "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "pathlib.Path(sys.argv[1]).touch(); time.sleep(60)", str(ready)],
        stdout=log_file, stderr=subprocess.STDOUT)
    backends.procs.append(("stubborn", child, log_file))
    for _ in range(200):
        if ready.exists():
            break
        time.sleep(0.05)
    assert ready.exists(), "the child did not start"
    backends.stop(time.monotonic() + 0.2)
    assert child.returncode == -signal.SIGKILL
    assert log_file.closed and backends.procs == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_cuts_a_skippable_step_short(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with pytest.raises(Skipped, match=sig.name), skippable():
        signal.raise_signal(sig)
        pytest.fail("the step went on after the signal")
    assert signal.getsignal(sig) is before


def test_a_part_named_after_another_stops_once_that_one_has() -> None:
    order: list[str] = []
    parts = Shutdown(within=10)
    parts.add("the simulator", lambda: order.append("simulator"), after="the exporter")
    parts.add("the exporter", lambda: (time.sleep(0.2), order.append("exporter")))
    assert parts.stop_all() == []
    assert order == ["exporter", "simulator"]


def test_a_closed_terminal_stops_the_demo_like_sigterm() -> None:
    """SIGHUP (the terminal closed) is handled like SIGTERM: Prometheus and Alertmanager run
    in sessions of their own, so an unhandled SIGHUP would leave them orphaned."""
    code = ("import os, signal, threading; from prefixwatch.simulator.cli import wait_for_signal;"
            "threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGHUP)).start();"
            "print(wait_for_signal(10).name)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "SIGHUP", done.stderr


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_a_signal_that_reaches_another_thread_still_stops_the_demo(sig: str) -> None:
    """The kernel delivers a process's signal to any of its threads; one that lands on a
    worker thread (here sent to one on purpose, with pthread_kill) is seen by the main
    thread's wait within a slice, not when a whole --duration has passed."""
    code = ("import signal, threading, time; from prefixwatch.simulator.cli import "
            "wait_for_signal;"
            f"threading.Timer(0.3, lambda: signal.pthread_kill(threading.get_ident(), "
            f"signal.{sig})).start();"
            "began = time.monotonic(); got = wait_for_signal(60);"
            "print(got.name, round(time.monotonic() - began, 1))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30)
    name, waited = done.stdout.split()
    assert done.returncode == 0 and name == sig, done.stderr
    assert float(waited) < 2.0, waited
