"""A real router (vllm-router or smg) between the workload and the replicas, on loopback.

Both install from PyPI as Rust wheels (``pip install 'prefixwatch[routers]'``) and run on CPU
in front of any OpenAI-compatible workers. vllm-router's ``kv_aware`` policy subscribes to each
worker's KV event stream (``--kv-event-source URL=ENDPOINT``), as it would to vLLM's; its
``cache_aware`` and smg's ``cache_aware`` keep an approximate tree of the request texts they
sent. Their /metrics are served on a port of their own (``--prometheus-port``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: The router kinds prefixwatch can start, their binaries and pinned releases.
BINARIES = {"vllm-router": "vllm-router", "smg": "smg"}
PINNED = {"vllm-router": "vllm-router==0.1.17", "smg": "smg==1.13.0"}
POLICIES = {"vllm-router": ("kv_aware", "cache_aware", "round_robin", "random", "power_of_two",
                            "consistent_hash", "sticky_least_loaded"),
            "smg": ("cache_aware", "round_robin", "random", "power_of_two", "prefix_hash",
                    "consistent_hashing", "least_load")}
#: A router's default policy here: the prefix-aware one. smg's cache_aware (like vllm-router's
#: kv_aware) sends every request to one worker while the load is light; its prefix_hash spreads
#: tenants over the workers by their first tokens, which is what the demo's story needs.
DEFAULT_POLICY = {"vllm-router": "kv_aware", "smg": "prefix_hash"}


def install_hint(kind: str) -> str | None:
    """None when the router's binary is on PATH; else how to install it."""
    if shutil.which(BINARIES[kind]):
        return None
    return (f"{kind} is not installed: pip install 'prefixwatch[routers]' (or pip install "
            f"{PINNED[kind]})")


@dataclass(frozen=True)
class RouterSpec:
    """One router to start: its kind and policy, where it listens, the workers behind it."""

    kind: str
    policy: str
    port: int
    metrics_port: int
    workers: tuple[str, ...]
    #: Worker URL -> its KV event endpoint (vllm-router's kv_aware).
    kv_sources: tuple[tuple[str, str], ...] = ()
    model: str = ""
    block_size: int = 16
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        if self.policy not in POLICIES[self.kind]:
            raise ValueError(f"{self.kind} has no policy {self.policy!r}; one of "
                             f"{', '.join(POLICIES[self.kind])}")
        common = ["--host", self.host, "--port", str(self.port), "--prometheus-host", self.host,
                  "--prometheus-port", str(self.metrics_port), "--worker-urls", *self.workers,
                  "--policy", self.policy]
        if self.kind == "smg":
            return [BINARIES["smg"], "launch", *common, "--block-size", str(self.block_size)]
        cmd = [BINARIES["vllm-router"], *common]
        if self.policy == "kv_aware":
            for worker, endpoint in self.kv_sources:
                cmd += ["--kv-event-source", f"{worker}={endpoint}"]
            cmd += ["--kv-event-block-size", str(self.block_size)]
            if self.model:
                cmd += ["--kv-event-model", self.model]
        return cmd


class RouterProcess:
    """A started router: ready once its API and its /metrics answer; stopped on SIGTERM, killed
    after a deadline."""

    def __init__(self, spec: RouterSpec, log_path: Path | None = None) -> None:
        self.spec = spec
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> RouterProcess:
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn"), "NO_COLOR": "1"}
        try:
            self.proc = subprocess.Popen(self.spec.command(), stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)
        finally:
            if self.log_path:
                out.close()  # type: ignore[union-attr]
        return self

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the router answers /health and /metrics; RuntimeError when it exits or the
        deadline passes."""
        deadline = time.monotonic() + timeout
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.spec.kind} exited with status {self.proc.returncode}"
                                   + (f" (log: {self.log_path})" if self.log_path else ""))
            if _answers(self.spec.url + "/health") and _answers(self.spec.metrics_url):
                return
            time.sleep(0.2)
        raise RuntimeError(f"{self.spec.kind} did not answer on {self.spec.url} within "
                           f"{timeout:g}s")

    def stop(self, timeout: float = 1.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            pass


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as r:  # noqa: S310 - loopback
            return r.status == 200
    except OSError:
        return False


def spec_for(kind: str, policy: str | None, ports: Sequence[int], workers: Sequence[str],
             kv_sources: Sequence[tuple[str, str]] = (), model: str = "",
             block_size: int = 16) -> RouterSpec:
    """A router spec with the kind's default policy and two given ports (API, metrics)."""
    return RouterSpec(kind, policy or DEFAULT_POLICY[kind], ports[0], ports[1], tuple(workers),
                      tuple(kv_sources), model, block_size)


def free_loopback_port() -> int:
    """A port free on 127.0.0.1 a moment ago (a router is told its ports on its command line)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RoutedWorkload:
    """The demo's workload through a real router, and the moment routing degrades: at
    ``degrade_at`` seconds the router is restarted with ``round_robin`` on the same ports (a
    bad deploy of the router's config), so each tenant's prefix is computed on every replica
    and the ledger's routing part rises."""

    def __init__(self, kind: str, policy: str | None, sim, scenario, rate: float,  # noqa: ANN001
                 log_dir: Path, degrade_at: float | None, seed: int = 1) -> None:
        from prefixwatch.simulator.driver import Driver

        workers = [url.removesuffix("/metrics") for url in sim.urls]
        kv = list(zip(workers, sim.kv_events_endpoints, strict=False))
        model = sim.servers[0].replica.config.model
        self.spec = spec_for(kind, policy, (free_loopback_port(), free_loopback_port()),
                             workers, kv, model)
        self.log_path = log_dir / f"{kind}.log"
        self.router = RouterProcess(self.spec, self.log_path)
        self.driver = Driver([s.replica for s in sim.servers], scenario, rate, seed=seed,
                             via=self.spec.url)
        self.degrade_at = degrade_at
        self._timer = None
        self._lock = threading.Lock()  # the router swapped by degrade(), or stopped
        self._stopped = False

    def start(self, timeout: float = 60.0) -> None:
        self.router.start().wait_ready(timeout)
        self.driver.start()
        if self.degrade_at is not None:
            self._timer = threading.Timer(self.degrade_at, self.degrade)
            self._timer.daemon = True
            self._timer.start()

    def degrade(self) -> None:
        """Restart the router with round_robin on the same ports."""
        import logging
        from dataclasses import replace

        logging.getLogger("prefixwatch.demo").warning(
            "routing degrades: %s restarted with --policy round_robin (was %s)",
            self.spec.kind, self.spec.policy)
        with self._lock:
            if self._stopped:
                return
            self.router.stop(timeout=0.5)
            self.spec = replace(self.spec, policy="round_robin")
            self.router = RouterProcess(self.spec, self.log_path).start()
        try:
            self.router.wait_ready()
        except RuntimeError as exc:
            logging.getLogger("prefixwatch.demo").warning("the router did not come back: %s",
                                                          exc)

    def stop(self) -> None:
        """Within the demo's shutdown deadline: the router is killed 0.2 s after SIGTERM (smg
        drains for minutes on SIGTERM)."""
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._stopped = True
            self.router.stop(timeout=0.2)
        self.driver.stop()
