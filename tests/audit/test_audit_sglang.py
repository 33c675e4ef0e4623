"""`prefixwatch audit --engine sglang`: SGLang's rule (pages of --page-size tokens, default 1,
within the first n - 1 tokens) and its radix cache as the pool replay."""

from __future__ import annotations

import json
import random

import pytest

from prefixwatch.audit.analysis import Auditor
from prefixwatch.audit.cli import main
from prefixwatch.simulator.scenarios import LAYOUTS, layout_prompt


@pytest.fixture
def table_log(tmp_path):
    """The SGLang manual's three layouts, six rounds, in log order."""
    rng = random.Random(1)
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps({"prompt": layout_prompt(LAYOUTS[i % 3], rng)}) + "\n"
                            for i in range(18)))
    return path


def audit(capsys, *argv: str) -> dict:
    assert main([*argv, "--tokenizer", "builtin", "--format", "json", "--no-progress"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sglangs_rule_serves_the_manuals_table_token_by_token(table_log, capsys) -> None:
    got = audit(capsys, str(table_log), "--engine", "sglang")
    # Cold: 0, then 5 and 2985 from the first prompt; warm rounds: 2998 + 5 + 2985.
    assert got["cacheable_tokens"] == 5 + 2985 + 5 * (2998 + 5 + 2985)
    assert got["engine"] == "sglang" and got["page_size"] == 1
    assert {row["position"] for row in got["divergence"]} == {5, 2985}
    vllm = audit(capsys, str(table_log))
    assert vllm["cacheable_tokens"] == 0 + 2976 + 5 * (2992 + 0 + 2976)


def test_page_size_and_the_pool_replay(table_log, capsys) -> None:
    paged = audit(capsys, str(table_log), "--engine", "sglang", "--page-size", "16",
                  "--kv-blocks", "100000")
    assert paged["cacheable_tokens"] == 0 + 2976 + 5 * (2992 + 0 + 2976)
    assert paged["simulated_hit_rate"] == paged["achievable_hit_rate"]  # nothing evicted
    small = audit(capsys, str(table_log), "--engine", "sglang", "--kv-blocks", "4000")
    assert small["simulated_hit_rate"] < small["achievable_hit_rate"]


def test_the_pool_replay_evicts_the_least_recently_used_prompt() -> None:
    auditor = Auditor(1, kv_blocks=250, engine="sglang")
    a, b = list(range(100)), list(range(1000, 1100))
    for prompt in (a, b, a, list(range(2000, 2100)), a, b):
        auditor.add(prompt)
    # a, b, a (99), c evicts b (a was used later), a (99), b (evicted: 0).
    assert auditor.report.simulated_cached_tokens == 99 + 99


@pytest.mark.parametrize("argv, message", [
    (["--engine", "sglang", "--block-size", "16"], "--page-size, not --block-size"),
    (["--page-size", "4"], "give it with --engine sglang"),
    (["--engine", "sglang", "--page-size", "0"], "--page-size must be at least 1"),
])
def test_bad_flags_are_one_line_and_exit_2(table_log, capsys, argv, message) -> None:
    assert main([str(table_log), *argv, "--tokenizer", "builtin"]) == 2
    assert message in capsys.readouterr().err
