"""The one story's words (core/story.py): percentages to one decimal, windows by their length,
the culprit as a person says it, and only causes that held at the drop as root causes."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from prefixwatch.core.story import Culprit, culprit_of, headline, percent, root_causes, window_words


@pytest.mark.parametrize("value,text", [
    (0.007752, "0.8%"), (0.0, "0.0%"), (1.0, "100.0%"), (0.6625, "66.2%"), (0.03, "3.0%"),
    (None, "-"), (math.nan, "-"),
])
def test_percentages_have_one_decimal(value: float | None, text: str) -> None:
    assert percent(value) == text


@pytest.mark.parametrize("seconds,text", [(6.000000000000001, "6s"), (120, "2m"), (90, "1m30s"),
                                          (3600, "1h"), (0.5, "500ms")])
def test_windows_by_their_length(seconds: float, text: str) -> None:
    assert window_words(seconds) == text


def test_the_culprit_is_the_most_frequent_kind_at_its_most_frequent_token() -> None:
    counts = Counter({("date/time", 22): 30, ("date/time", 19): 5, ("number", 40): 8,
                      ("own content", 1800): 90, ("unknown", 3): 50})
    found = culprit_of(counts)
    assert found == Culprit("date/time", 22, 35 / 43)
    assert found.words == "a date/time at token 22 of the prompt changes on every request"
    assert culprit_of({("own content", 1800): 9, ("unknown", 4): 2}) is None


def test_one_request_that_parts_from_the_old_prompt_is_no_culprit() -> None:
    """A deploy's first request parts from the old prompt where the new line starts (text at
    token 5), once; the timestamp after it parts every request from the next."""
    first = Counter({("text", 5): 1, ("date/time", 10): 1})
    assert culprit_of(first) is None
    first[("date/time", 10)] += 1
    assert culprit_of(first) is None  # a tie of few is no story yet
    first[("date/time", 10)] += 1
    assert culprit_of(first) == Culprit("date/time", 10, 3 / 4)
    assert Culprit("id", 7, 0.2).words == "an id at token 7 of the prompt changes on some requests"
    assert Culprit("date/time", 18, 1.0, last=20).words.startswith("a date/time at tokens 18-20")


def test_a_cause_that_ended_before_the_drop_is_no_root_cause() -> None:
    spans = {"cold_start": [(0.0, 40.0)], "prefix_divergence": [(45.0, None)],
             "no_ttft_benefit": [(46.0, 50.0)]}
    assert root_causes(spans, drop_at=44.0) == ["prefix_divergence", "no_ttft_benefit"]
    assert root_causes(spans, drop_at=None)[0] == "prefix_divergence"


def test_the_headline() -> None:
    culprit = Culprit("date/time", 19, 0.9)
    assert headline("effective hit ratio", 0.0078, "6s", ["prefix_divergence"], culprit) == (
        "effective hit ratio 0.8% over 6s; cause: prefix_divergence; culprit: a date/time at "
        "token 19 of the prompt changes on every request")
    assert headline("device hit ratio", None, "1m", [], None) == (
        "device hit ratio - over 1m; cause: none diagnosed")
