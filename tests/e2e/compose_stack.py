"""One docker-compose project of the committed docker-compose.yml, run for a test.

Debian's docker-compose 1.29 refuses the compose-spec top-level `name:` key, which Compose v2
(what users run) reads; the project runs a copy of the file without it, under `-p`, with every
published port moved to a free one on 127.0.0.1. Nothing else of the file changes: relative
paths resolve against the repository (`--project-directory`), and an empty env file keeps a
developer's `.env` out of it.

Every call has a deadline, and `report()` gives each container's state, health, restart count
and last log lines, which every failure message of the test carries.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import free_port

LABEL = "com.docker.compose.project"
# Settings of the stack that come from the environment; a test run sets its own.
STACK_ENV = ("VLLM_TARGETS", "PREFIXWATCH_", "GRAFANA_", "VLLM_MODEL", "HF_TOKEN", "COMPOSE_")


def compose_copy(root: Path, dest: Path) -> tuple[Path, dict[str, int]]:
    """docker-compose.yml without `name:`, published on free loopback ports; returns the
    copy and the host port of each service's first published port."""
    doc = yaml.safe_load((root / "docker-compose.yml").read_text())
    doc.pop("name", None)
    host_ports: dict[str, int] = {}
    for service, spec in doc["services"].items():
        ports = []
        for mapping in spec.get("ports", []):
            address, _, container = str(mapping).rpartition(":")
            host, _, _ = address.rpartition(":")
            assert host == "127.0.0.1", f"{service} publishes {mapping} beyond loopback"
            port = free_port()
            host_ports.setdefault(service, port)
            ports.append(f"127.0.0.1:{port}:{container}")
        if ports:
            spec["ports"] = ports
    dest.write_text(yaml.safe_dump(doc, sort_keys=False))
    return dest, host_ports


class Compose:
    """docker-compose and docker calls for one project."""

    def __init__(self, compose: str, docker: str, root: Path, tmp: Path, project: str,
                 env: dict[str, str]) -> None:
        self.docker = docker
        self.project = project
        self.file, self.ports = compose_copy(root, tmp / "docker-compose.yml")
        env_file = tmp / "empty.env"
        env_file.write_text("")
        self.base = [compose, "--env-file", str(env_file), "--project-directory", str(root),
                     "-f", str(self.file), "-p", project]
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(STACK_ENV)}
        self.env.update(env)
        self.services: list[str] = []

    def run(self, *args: str, timeout: float = 120, check: bool = True
            ) -> subprocess.CompletedProcess:
        proc = subprocess.run([*self.base, *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env)
        if check and proc.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)} failed ({proc.returncode}):"
                                 f"\n{proc.stderr[-3000:]}{self.report()}")
        return proc

    def docker_out(self, *args: str, timeout: float = 30) -> str:
        proc = subprocess.run([self.docker, *args], capture_output=True, text=True,
                              timeout=timeout)
        return proc.stdout

    def container(self, service: str) -> str:
        return self.run("ps", "-q", service, timeout=60, check=False).stdout.strip()

    def inspect(self, service: str) -> dict[str, Any]:
        cid = self.container(service)
        if not cid:
            return {}
        found = json.loads(self.docker_out("inspect", cid) or "[]")
        return found[0] if found else {}

    def state(self, service: str) -> tuple[str, str, int]:
        """(status, health, restarts) of the service's container."""
        info = self.inspect(service)
        if not info:
            return "missing", "none", 0
        state = info["State"]
        return state["Status"], state.get("Health", {}).get("Status", "none"), info[
            "RestartCount"]

    def logs(self, service: str, lines: int = 15) -> str:
        cid = self.container(service)
        if not cid:
            return "(no container)"
        proc = subprocess.run([self.docker, "logs", "--tail", str(lines), cid],
                              capture_output=True, text=True, timeout=30)
        return (proc.stdout + proc.stderr).rstrip() or "(no output)"

    def report(self) -> str:
        """Each started service's state and its container's last log lines."""
        parts = []
        for service in self.services:
            try:
                status, health, restarts = self.state(service)
                parts.append(f"\n--- {service}: {status}, health {health}, {restarts} "
                             f"restarts; last log lines:\n{self.logs(service)}")
            except (subprocess.SubprocessError, OSError, ValueError) as exc:
                parts.append(f"\n--- {service}: cannot inspect ({exc})")
        return "".join(parts)

    def wait_healthy(self, timeout: float) -> float:
        """Until every started service is healthy; fails at the first restart or exit."""
        start = time.monotonic()
        while True:
            states = {s: self.state(s) for s in self.services}
            bad = {s: st for s, st in states.items() if st[2] > 0 or st[0] not in (
                "running", "created")}
            if bad:
                raise AssertionError(f"not running cleanly: {bad}{self.report()}")
            if all(st[1] == "healthy" for st in states.values()):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"not healthy within {timeout:g}s: {states}"
                                     f"{self.report()}")
            time.sleep(2)

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, volumes and networks still labelled with this project."""
        found = {}
        for kind in ("container", "volume", "network"):
            listing = self.docker_out(kind, "ls", "-q", *(["-a"] if kind == "container" else []),
                                      "--filter", f"label={LABEL}={self.project}")
            found[kind] = listing.split()
        return {kind: ids for kind, ids in found.items() if ids}

    def down(self) -> None:
        self.run("down", "-v", "--remove-orphans", "-t", "5", timeout=120, check=False)
