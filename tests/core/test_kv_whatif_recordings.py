"""The pool what-if on vLLM 0.33's own KV event streams (tests/fixtures/kv_events/fleet: two
replicas of 700 blocks, 48 requests with their cached tokens): each replica's what-if, from its
stream alone, equals (to the block) its requests replayed through vLLM's caching rule at 1.25,
1.5, 2 and 4 times its pool (``core/cache/blockcache.py``, the audit's replay), and that replay
at 1x gives the cached tokens vLLM reported."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from prefixwatch.audit.analysis import LruReplay
from prefixwatch.core.kv.codec import BatchDecoder
from prefixwatch.core.kv.mirror import FleetContent, TargetMirror
from prefixwatch.core.kv.whatif import POOL_SCALES

FLEET = Path(__file__).parents[1] / "fixtures" / "kv_events" / "fleet"
POOL = 700  # num_gpu_blocks of both replicas' pages


def test_each_replicas_what_if_is_its_requests_replayed_at_the_larger_pools() -> None:
    requests = [json.loads(line) for line in (FLEET / "requests.jsonl").read_text().splitlines()]
    messages = [json.loads(line) for line in (FLEET / "kv_events.jsonl").read_text().splitlines()]
    decoder = BatchDecoder()
    replicas = sorted({r["replica"] for r in requests})
    assert len(replicas) == 2
    curve: list[int] = []
    for replica in replicas:
        mirror = TargetMirror(FleetContent("llama"))
        mirror.whatif.set_pool(POOL)
        for m in messages:
            if m["topic"].split("@")[1] == replica:
                mirror.apply(decoder.decode(base64.b64decode(m["payload_b64"])))
        mine = [r for r in requests if r["replica"] == replica]
        cached = sum(r["cached_tokens"] for r in mine)

        def replayed(blocks: int, mine=mine) -> int:
            pool = LruReplay(blocks, 16)
            return sum(pool.add(r["prompt_token_ids"]) for r in mine)

        assert replayed(POOL) == cached  # the replay is vLLM's rule on these requests
        gained = mirror.snapshot().whatif
        for scale in POOL_SCALES:
            # To the block: a larger pool's hits allocate nothing, which the what-if follows;
            # what it cannot see is one request's last prompt block (vLLM recomputes a prompt's
            # last token, docs/capacity.md).
            got, replay = cached + gained[scale], replayed(round(POOL * float(scale)))
            assert abs(got - replay) <= 16, (replica, scale, got, replay)
            curve.append(replay - cached)
    assert max(curve) > 0  # a real curve: the larger pools gain on these streams
