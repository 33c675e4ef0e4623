"""SGLang's KV event stream reaches the exporter: two simulated SGLang replicas publish SGLang's
positional events (a page an event, SHA-256 page hashes) on free ports, the exporter subscribes
to each, and its event ledger closes to the token beside SGLang's counters, as it does on
vLLM's recordings: prompts that share a system prompt, repeated prompts (SGLang stores their
answers once), answers of different lengths.

Real sockets and HTTP on 127.0.0.1, ports 0; every wait is bounded.
"""

from __future__ import annotations

import time

import pytest
import requests

from prefixwatch.core.vocab import exposition
from prefixwatch.simulator.engine import EngineConfig
from tests.e2e.test_kv_stream_e2e import (
    replicas_and_exporter,
    scrape,
    value,
    wait_for_ledgers,
)

SYSTEM = [5_000 + j for j in range(40)]


@pytest.mark.integration
@pytest.mark.parametrize("page_size", [1, 16])
def test_the_event_ledger_closes_to_the_token_on_an_sglang_stream(page_size: int) -> None:
    cfg = EngineConfig(prefill_tokens_per_s=2e5, time_per_output_token=0.002,
                       page_size=page_size)
    with replicas_and_exporter(cfg, "sglang") as (sims, targets, exporter):
        truth = {t.name: {"prompt": 0, "cached": 0, "output": 0, "requests": 0}
                 for t in targets}
        for k in range(10):
            i, answer = k % 2, 8 + 8 * (k % 3)
            prompt = SYSTEM + [9_000 + 100 * (k % 6) + j for j in range(21 + 7 * (k % 6))]
            r = requests.post(f"http://127.0.0.1:{sims[i].port}/v1/completions",
                              json={"prompt": prompt, "max_tokens": answer}, timeout=10)
            assert r.status_code == 200
            usage = r.json()["usage"]
            row = truth[f"r{i}"]
            row["prompt"] += len(prompt)
            row["cached"] += (usage["prompt_tokens_details"] or {}).get("cached_tokens", 0)
            row["output"] += answer - 1
            row["requests"] += 1
            time.sleep(0.1)

        wait_for_ledgers(exporter, truth, 5)
        got = scrape(exporter.port)
        for t, row in truth.items():
            span = exporter.kv_ledgers.span(t, None)
            assert span is not None
            shares = span.shares
            assert shares["unexplained"] == 0, shares
            assert shares["achieved"] == row["cached"]
            assert shares[exposition.LEDGER_OUTPUT] == row["output"]
            assert 0 <= shares[exposition.LEDGER_TAIL] <= page_size * row["requests"]
            assert sum(shares[p] for p in exposition.KV_LEDGER_SHARES) == span.prompt
            assert all(shares[p] >= 0 for p in exposition.KV_LEDGER_SHARES), shares
            cache = sims[int(t[1])].replica.engine.cache
            assert value(got, "prefixwatch_kv_resident_blocks", target=t, medium="GPU") == (
                cache.evictable + cache.protected) // page_size
            assert value(got, "prefixwatch_kv_events_lost_total", target=t) == 0.0
        # r1's first request found the system prompt on r0 (SGLang's hashes are the same on
        # every replica; the mirror names content, not hashes): routing.
        assert value(got, "prefixwatch_kv_computed_tokens_total", target="r1",
                     model_name=cfg.model, part="routing") > 0
