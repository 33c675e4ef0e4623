"""The ledger's truth, from the simulator's own state rather than from a log.

For every request the driver sends, in order: the chained ids of its full blocks (the pool's
own identity), and whether each earlier request of the fleet or of the same replica had
computed them (every block a replica has ever computed, never forgotten: an unlimited cache).
The engine then says what its pool really served (``cached_tokens``). And the scenario says
what its prompt would be with the varying span made constant (``Work.fixed``): what an
unlimited cache over the fixed prompts would serve beyond ``fleet_reach`` is ``layout``.

So ``achieved`` is the engine's, ``eviction = replica_reach - achieved`` (evicted, or held by
a running batch), ``routing = fleet_reach - replica_reach``, and nothing is unexplained.
Memory grows with the run: for tests and short simulations (``--ledger-truth``), not for a
simulator left running.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prefixwatch.core.cache.blockcache import block_ids, cached_tokens_for, root_id
from prefixwatch.core.cache.requestledger import Parts
from prefixwatch.simulator.engine import SimRequest


@dataclass
class _Record:
    req: SimRequest
    parts: Parts  # everything but achieved, eviction and pool_reach


class LedgerTruth:
    def __init__(self, block_size: int) -> None:
        self.bs = block_size
        self.fleet: set[int] = set()
        self.fixed: set[int] = set()
        self.replicas: dict[int, set[int]] = {}
        self.records: list[_Record] = []
        self.lock = threading.Lock()

    def _reach(self, seen: set[int], ids: Sequence[int], n: int) -> int:
        hit = 0
        for block in ids:
            if block not in seen:
                break
            hit += 1
        return cached_tokens_for(n, hit, self.bs)

    def record(self, replica: int, req: SimRequest, fixed_prompt: Sequence[int]) -> None:
        """A request just submitted to ``replica`` (in log order)."""
        root = root_id(req.extra_keys)
        n = len(req.prompt)
        ids = block_ids(req.prompt, self.bs, root)
        fixed_ids = block_ids(fixed_prompt, self.bs, root)
        with self.lock:
            own = self.replicas.setdefault(replica, set())
            fleet = self._reach(self.fleet, ids, n)
            mine = self._reach(own, ids, n)
            fixed = self._reach(self.fixed, fixed_ids, len(fixed_prompt))
            layout = min(max(0, fixed - fleet), n - fleet)
            self.fleet.update(ids)
            own.update(ids)
            self.fixed.update(fixed_ids)
            self.records.append(_Record(req, Parts(n, n - fleet - layout, layout, fleet - mine,
                                                   0, mine, None, 1)))

    def totals(self, timeout: float = 30.0) -> Parts:
        """The ledger of every request recorded, once the engines have scheduled them all."""
        deadline = time.monotonic() + timeout
        out = Parts()
        with self.lock:
            records = list(self.records)
        for rec in records:
            while rec.req.scheduled_at is None and rec.req.error is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("requests still waiting to be scheduled")
                time.sleep(0.01)
            got = rec.req.cached_tokens
            p = rec.parts
            out += Parts(p.prompt, p.novel, p.layout, p.routing, p.pool_reach - got, got, got,
                         1)
        return out

