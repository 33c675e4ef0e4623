"""The pool what-if against the simulator: how close the curve measured from one run's KV event
stream comes to the hit ratio of runs at the larger pools, and what the what-if keeps.

A scenario's seeded requests run one at a time on a simulated replica at the base pool (its KV
events through the exporter's decode and mirror) and at 1.25, 1.5, 2 and 4 times that pool
(``prefixwatch.simulator.poolcheck``); the table gives the what-if from the base run beside
each larger run's delivered hit ratio. The acceptance: within 3 points at 1.5x and 2x.

Run: python benchmarks/bench_pool_whatif.py [--scenario working-set] [--blocks 500]
     [--requests 300] [--together 1]
(--together N: N requests at a time, a schedule the larger pools change: the what-if's limit)
"""

from __future__ import annotations

import argparse

from prefixwatch.core.kv.whatif import POOL_SCALES
from prefixwatch.simulator import poolcheck


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="working-set",
                        help="simulator scenario (default working-set)")
    parser.add_argument("--blocks", type=int, default=500, help="base pool (default 500)")
    parser.add_argument("--requests", type=int, default=300, help="requests (default 300)")
    parser.add_argument("--together", type=int, default=1,
                        help="requests submitted at once, then run to idle (default 1: one at "
                             "a time, the schedule the what-if is exact for)")
    args = parser.parse_args()
    if args.blocks < 2 or args.requests < 1 or args.together < 1:
        parser.error("--blocks must be at least 2, --requests and --together at least 1")
    base, larger = poolcheck.compare(args.scenario, args.blocks, POOL_SCALES, args.requests,
                                     together=args.together)
    print("\n".join(poolcheck.table(args.scenario, base, larger)))
    worst = max(abs(base.whatif_ratio(s) - r.ratio) for s, r in larger.items())
    print(f"largest difference: {100 * worst:.2f} points (goal: within 3 at 1.5x and 2x)")


if __name__ == "__main__":
    main()
