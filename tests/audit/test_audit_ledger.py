"""`prefixwatch audit` prints the ledger of a log: hand-computed parts (block size 4)."""

from __future__ import annotations

import json
import subprocess
import sys

from prefixwatch.audit.analysis import Auditor

P = list(range(1, 10))  # 9 tokens: 2 cacheable blocks of 4
OTHER = list(range(30, 39))


def test_auditor_ledger_by_replica_and_pool() -> None:
    auditor = Auditor(4, kv_blocks=4)  # 3 usable blocks: OTHER evicts P
    for tokens, replica, cached in ((P, "a", 0), (P, "b", 0), (OTHER, "a", 0), (P, "a", 0)):
        auditor.add(tokens, None, replica, cached)
    t = auditor.ledger.totals
    # P on b: 8 routing; P on a after OTHER: 8 evicted; every request: its 9th token novel.
    assert (t.prompt, t.novel, t.layout, t.routing, t.eviction, t.pool_reach, t.achieved) == (
        36, 9 + 1 + 9 + 1, 0, 8, 8, 0, 0)
    assert auditor.ledger.unmeasured() == ()


def test_audit_cli_prints_the_ledger(tmp_path) -> None:
    log = tmp_path / "fleet.jsonl"
    rows = [{"prompt_token_ids": P, "replica": "a", "cached_tokens": 0},
            {"prompt_token_ids": P, "replica": "a", "cached_tokens": 4}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, "-m", "prefixwatch.cli", "audit", str(log),
                          "--block-size", "4", "--kv-blocks", "16", "--format", "json"],
                         capture_output=True, text=True, check=True)
    ledger = json.loads(out.stdout)["ledger"]
    assert {k: ledger[k] for k in ("prompt", "novel", "pool_reach", "achieved",
                                   "unexplained")} == {
        "prompt": 18, "novel": 10, "pool_reach": 8, "achieved": 4, "unexplained": 4}
    text = subprocess.run([sys.executable, "-m", "prefixwatch.cli", "audit", str(log),
                           "--block-size", "4"], capture_output=True, text=True, check=True)
    assert "eviction" in text.stdout and "not separable: the pool size is unknown" in text.stdout


def test_audit_layout_measures_the_identical_run_after_the_span() -> None:
    """The audit's index holds lists: the run after a varying first token is measured on the
    trie's list edges (an array copy of the sibling never compared equal to a list slice, so
    the audit credited one block instead of the whole run)."""
    shared = list(range(1, 40))  # 39 tokens both prompts share after their first token
    auditor = Auditor(4)
    auditor.add([100, *shared, 50, 51, 52, 53])
    auditor.add([101, *shared, 60, 61, 62, 63])
    t = auditor.ledger.totals
    # The second request: diverges at 0, then agrees to token 40: 10 whole blocks of layout.
    assert (t.prompt, t.layout, t.novel, t.pool_reach) == (88, 40, 44 + 4, 0)
