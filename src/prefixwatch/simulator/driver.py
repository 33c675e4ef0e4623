"""The built-in workload: Poisson arrivals of a scenario's requests, routed over replicas.

Open loop (arrivals do not wait for answers), as real traffic is: when the cache stops
working, prefill queues build up and TTFT grows, instead of the load politely slowing down.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import zlib
from collections.abc import Sequence
from datetime import UTC, datetime

from prefixwatch.simulator.engine import SimRequest
from prefixwatch.simulator.scenarios import SCENARIOS, Corpus, Scenario, Work
from prefixwatch.simulator.server import BadRequest, Replica
from prefixwatch.simulator.truth import LedgerTruth
from prefixwatch.simulator.via import ViaRouter

log = logging.getLogger("prefixwatch.simulate")


class Router:
    def __init__(self, replicas: Sequence[Replica], policy: str) -> None:
        if policy not in ("round-robin", "prefix-affinity"):
            raise ValueError(f"unknown routing policy {policy!r}")
        self.replicas = list(replicas)
        self.policy = policy
        self._next = 0

    def pick(self, work: Work) -> Replica:
        if self.policy == "prefix-affinity" and work.route_key:
            return self.replicas[zlib.crc32(work.route_key.encode()) % len(self.replicas)]
        replica = self.replicas[self._next % len(self.replicas)]
        self._next += 1
        return replica


def tokenize_work(replica: Replica, body: dict) -> tuple[list[int], str | None]:
    if "messages" in body:
        return replica.tokenize_chat(body)
    return replica.tokenize_prompt(body["prompt"])


def submit_work(replica: Replica, work: Work, truth: LedgerTruth | None = None) -> SimRequest:
    body = work.body
    extra = replica.extra_keys(body.get("model"), body.get("cache_salt"))
    prompt, text = tokenize_work(replica, body)
    req = replica.submit(prompt, int(body.get("max_tokens", 16)), extra, text)
    if truth is not None:
        fixed = prompt if work.fixed is None else tokenize_work(replica, work.fixed)[0]
        truth.record(replica.index, req, fixed)
    return req


class Driver:
    """Sends a scenario's requests at ``rate`` per second; can switch scenario at a time."""

    def __init__(self, replicas: Sequence[Replica], scenario: Scenario, rate: float,
                 seed: int = 1, switch_at: float | None = None,
                 switch_to: Scenario | None = None, routing: str | None = None,
                 restart_at: float | None = None, truth: LedgerTruth | None = None,
                 via: str | None = None) -> None:
        self.replicas = list(replicas)
        self.truth = truth
        self.scenario = scenario
        self.rate = rate
        self.rng = random.Random(seed)
        self.corpus = Corpus.build()
        self.switch_at = switch_at
        self.switch_to = switch_to
        self.restart_at = restart_at
        self.router = Router(self.replicas, routing or scenario.routing)
        #: ``--via URL``: a router chooses the replica of each request, not ``self.router``.
        self.via = (ViaRouter(via, self.replicas[0].config.model if self.replicas else None)
                    if via else None)
        self.sent = 0
        self.rejected = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="driver", daemon=True)
        self.started = 0.0

    def start(self) -> None:
        self.started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if self.via is not None:
            self.via.close()

    def _run(self) -> None:
        next_at = time.monotonic()
        switched = restarted = False
        while not self._stop.is_set():
            now = time.monotonic()
            elapsed = now - self.started
            if (not switched and self.switch_at is not None and self.switch_to is not None
                    and elapsed >= self.switch_at):
                switched = True
                log.warning("switching workload: %s -> %s (a bad deploy)", self.scenario.name,
                            self.switch_to.name)
                self.scenario = self.switch_to
            if not restarted and self.restart_at is not None and elapsed >= self.restart_at:
                restarted = True
                for replica in self.replicas:
                    replica.restart()
            if now < next_at:
                self._stop.wait(min(next_at - now, 0.5))
                continue
            self.send_one()
            next_at += self.rng.expovariate(self.rate)
            if time.monotonic() - next_at > 5.0:
                next_at = time.monotonic()  # fell behind: do not burst to catch up

    def send_one(self) -> None:
        work = self.scenario.make(self.rng, self.corpus, datetime.now(UTC))
        if self.via is not None:
            if self.via.submit(work.body):
                self.sent += 1
            return
        replica = self.router.pick(work)
        try:
            submit_work(replica, work, self.truth)
            self.sent += 1
        except BadRequest as exc:
            self.rejected += 1
            if self.rejected in (1, 10, 100, 1000) or self.rejected % 10000 == 0:
                log.warning("replica %d rejected a request (%d so far): %s", replica.index,
                            self.rejected, exc)


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
