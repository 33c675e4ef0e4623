"""The ladder (core/kv/ladder.py): cumulative hit ratios, each fix added in turn."""

from __future__ import annotations

import pytest

from prefixwatch.core.kv.ladder import ladder, lines


def test_each_rung_adds_its_part() -> None:
    shares = {"achieved": 540, "routing": 290, "layout": 100, "eviction": 20, "novel": 50}
    rungs = ladder(shares, 1000)
    assert rungs == pytest.approx({"delivered": 0.54, "perfect_routing": 0.83,
                                   "ideal_prompts": 0.93})
    with_capacity = ladder(shares, 1000, capacity_tokens=20)
    assert with_capacity["capacity"] == pytest.approx(0.85)
    assert with_capacity["ideal_prompts"] == pytest.approx(0.95)


def test_no_prompt_tokens_no_ladder_and_never_above_one() -> None:
    assert ladder({"achieved": 0}, 0) == {}
    assert ladder({"achieved": 900, "routing": 90, "layout": 90}, 1000)["ideal_prompts"] == 1.0


def test_lines_say_what_each_fix_is_worth() -> None:
    text = lines(ladder({"achieved": 540, "routing": 290, "layout": 100}, 1000))
    assert text[0].startswith("delivered") and text[0].endswith("54.0%")
    assert text[1].endswith("83.0%  (+29.0 points)")
    assert len(text) == 3  # no capacity rung without its measure
