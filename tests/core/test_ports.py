"""Port checks as servers bind (SO_REUSEADDR), and who holds a port."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from prefixwatch.core.ports import port_free, port_in_use_message, port_owner, process_command


def test_time_wait_is_free_for_a_server_but_a_listener_is_not() -> None:
    """A server that closed its side first leaves TIME_WAIT on its port: a restart binds it
    (as Prometheus and Python's HTTPServer do), where a plain bind would refuse."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    client.recv(1)
    client.close()
    listener.close()
    plain = socket.socket()
    try:
        plain.bind(("127.0.0.1", port))
        time_wait_seen = False
    except OSError:
        time_wait_seen = True
    finally:
        plain.close()
    assert time_wait_seen, "the kernel left no TIME_WAIT: the test proves nothing"
    assert port_free(port)


def test_a_listener_is_named_by_pid_and_command() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        assert not port_free(port)
        # The command as ps shows it: python, or the title a worker set (pytest-xdist names
        # its workers after the running test when setproctitle is installed).
        assert port_owner(port) == f"pid {os.getpid()} ({process_command(Path('/proc/self'))})"
        assert port_owner(port).split("(")[1] != "?)"
        message = port_in_use_message(port, "Alertmanager", "--alertmanager-port")
        assert message.startswith(f"port {port} on 127.0.0.1 for Alertmanager is in use, "
                                  f"held by pid {os.getpid()} (")
        assert message.endswith("; choose another with --alertmanager-port")
    finally:
        listener.close()
    assert port_free(port) and port_owner(port) is None
