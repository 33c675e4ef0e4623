"""Is a TCP port free, the way a server will bind it, and if not, who holds it.

Servers (Prometheus, Alertmanager, Python's HTTPServer) bind with SO_REUSEADDR, so a port
left in TIME_WAIT by a run that just stopped is free for them; a check without it would
refuse a restart for a minute. The owner comes from /proc/net/tcp{,6} (the listening
socket's inode) and /proc/<pid>/fd (which process holds that inode), Linux only; elsewhere,
or for another user's process, the message says the owner is not visible.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's "st" column


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a server binding ``host:port`` with SO_REUSEADDR would succeed now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _listening_inodes(port: int, proc: Path) -> set[str]:
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(fields[9])
    return inodes


def port_owner(port: int, proc: Path = Path("/proc")) -> str | None:
    """``pid 123 (prometheus)`` for the process listening on ``port``; None when unknown."""
    wanted = {f"socket:[{inode}]" for inode in _listening_inodes(port, proc)}
    if not wanted:
        return None
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:
            continue  # another user's process, or gone
        for fd in fds:
            try:
                if os.readlink(fd) in wanted:
                    return f"pid {entry.name} ({process_command(entry)})"
            except OSError:
                continue
    return None


def process_command(entry: Path) -> str:
    """A process as ps shows it: its first three words (the program's base name), else its name."""
    try:
        argv = (entry / "cmdline").read_bytes().split(b"\0")
        words = [a.decode(errors="replace") for a in argv if a][:3]
        if words:
            return " ".join([Path(words[0]).name, *words[1:]])[:80]
        return (entry / "comm").read_text().strip()
    except OSError:
        return "?"


def port_in_use_message(port: int, what: str, flag: str, host: str = "127.0.0.1") -> str:
    """One line saying which port is taken, by whom, and which flag picks another."""
    owner = port_owner(port)
    held = f"held by {owner}" if owner else "held by another process (not visible to you)"
    return f"port {port} on {host} for {what} is in use, {held}; choose another with {flag}"
