"""Reading engine pages: the real vLLM 0.33 page, other generations, and bad pages."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.vocab import schemas
from prefixwatch.exporter.pagereader import PageError, detect_schema, read_page

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def test_real_vllm_page(vllm_page: str) -> None:
    snap = read_page(vllm_page)
    assert snap.schema is schemas.VLLM_V1
    values = snap.series[(MODEL, "0")]
    assert values.counters["queries"] == 13902
    assert values.counters["hits"] == 7168
    assert values.counters["prompt_tokens"] == 13902
    assert values.counters["ext_queries"] == 0
    assert values.counters["preemptions"] == 0
    assert values.gauges["kv_usage"] == 0
    assert values.block_size == 16
    assert values.caching_enabled is True
    ttft = values.histograms["ttft"]
    assert ttft.count == 12 and len(ttft.bounds) == 23 and math.isinf(ttft.bounds[-1])
    assert values.histograms["prompt_len"].sum == 13902
    assert values.created["queries"] > 1.7e9


def test_same_values_as_a_full_parse(vllm_page: str) -> None:
    """The selective reader agrees with client_python's full parse on every value it reads."""
    full = {}
    for family in text_string_to_metric_families(vllm_page):
        for s in family.samples:
            full[(s.name, tuple(sorted(s.labels.items())))] = s.value
    labels = (("engine", "0"), ("model_name", MODEL))
    values = read_page(vllm_page).series[(MODEL, "0")]
    for role, name in schemas.VLLM_V1.roles("counter").items():
        assert values.counters[role] == full[(name, labels)]
    for role, name in schemas.VLLM_V1.roles("gauge").items():
        if role in values.gauges:
            assert values.gauges[role] == full[(name, labels)]
    hist = values.histograms["ttft"]
    for bound, count in zip(hist.bounds, hist.counts, strict=True):
        le = "+Inf" if math.isinf(bound) else str(bound)
        key = ("vllm:time_to_first_token_seconds_bucket", tuple(sorted((*labels, ("le", le)))))
        assert count == full[key]


def multiprocess_form(page: str) -> str:
    """As client_python's multiprocess collector writes it: no _created, families reordered."""
    families: list[list[str]] = []
    for line in page.splitlines():
        if line.startswith("# HELP"):
            families.append([])
        if "_created" in line.split(" ")[0] or "_created " in line:
            continue
        if families:
            families[-1].append(line)
    random.Random(3).shuffle(families)
    return "\n".join(line for fam in families for line in fam) + "\n"


def test_multiprocess_page(vllm_page: str) -> None:
    snap = read_page(multiprocess_form(vllm_page))
    values = snap.series[(MODEL, "0")]
    assert values.counters["queries"] == 13902 and values.counters["hits"] == 7168
    assert values.created == {}
    assert values.histograms["ttft"].count == 12


def test_data_parallel_engines(vllm_page: str) -> None:
    lines = []
    for line in vllm_page.splitlines():
        lines.append(line)
        if line.startswith("vllm:") and 'engine="0"' in line:
            lines.append(line.replace('engine="0"', 'engine="1"'))
    snap = read_page("\n".join(lines) + "\n")
    assert {k[1] for k in snap.series} == {"0", "1"}
    assert snap.series[(MODEL, "1")].counters["hits"] == 7168


def test_legacy_vllm_names() -> None:
    page = (
        "# TYPE vllm:gpu_prefix_cache_queries_total counter\n"
        'vllm:gpu_prefix_cache_queries_total{model_name="m"} 100.0\n'
        "# TYPE vllm:gpu_prefix_cache_hits_total counter\n"
        'vllm:gpu_prefix_cache_hits_total{model_name="m"} 40.0\n'
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
    )
    snap = read_page(page)
    assert snap.schema is schemas.VLLM_GPU_PREFIX
    values = snap.series[("m", "0")]
    assert values.counters == {"queries": 100.0, "hits": 40.0, "cached_device": 40.0,
                               "cached_host": 0.0, "cached_disk": 0.0, "cached_remote": 0.0,
                               "cached_unknown": 0.0, "cached": 40.0}  # no split: device hits
    assert values.gauges["kv_usage"] == 0.5


def test_v0_gauge_is_passed_through() -> None:
    page = 'vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.25\n'
    snap = read_page(page)
    assert snap.schema is schemas.VLLM_V0 and not snap.schema.windows_supported
    assert snap.series[("m", "0")].gauges["engine_reported_hit_ratio"] == 0.25


def test_sglang_counters_and_ranks() -> None:
    page = (
        'sglang:prompt_tokens_total{model_name="q",tp_rank="0"} 1000.0\n'
        'sglang:prompt_tokens_total{model_name="q",tp_rank="1"} 1000.0\n'
        'sglang:cached_tokens_total{model_name="q",tp_rank="0"} 600.0\n'
        'sglang:cached_tokens_total{model_name="q",tp_rank="1"} 600.0\n'
        'sglang:cache_hit_rate{model_name="q",tp_rank="0"} 0.9\n'
        'sglang:token_usage{model_name="q",tp_rank="0"} 0.3\n'
    )
    snap = read_page(page)
    assert snap.schema is schemas.SGLANG
    values = snap.series[("q", "0")]
    # tp_rank 1 repeats rank 0's counters: read once, not summed.
    assert values.counters["queries"] == 1000 and values.counters["hits"] == 600
    assert values.gauges["engine_reported_hit_ratio"] == 0.9


def test_sglang_realtime_tokens_fallback() -> None:
    page = (
        'sglang:prompt_tokens_total{model_name="q"} 1000.0\n'
        'sglang:realtime_tokens_total{mode="prefill_compute",model_name="q"} 300.0\n'
        'sglang:realtime_tokens_total{mode="prefill_cache",model_name="q"} 700.0\n'
        'sglang:realtime_tokens_total{mode="decode",model_name="q"} 50.0\n'
    )
    values = read_page(page).series[("q", "0")]
    assert values.counters["hits"] == 700 and values.counters["queries"] == 1000


@pytest.mark.parametrize("body,reason", [
    ("", "not_metrics"),
    ("<!DOCTYPE html><html><body>502 Bad Gateway</body></html>\n", "not_metrics"),
    ('{"error": "not found"}\n', "not_metrics"),
    ("# HELP foo a thing\nfoo 1\n", "not_metrics"),
    ('vllm:prefix_cache_queries_total{model_name="m"} 1\nvllm:prefix_cache_hits_total{mod',
     "parse"),
    ('vllm:prefix_cache_queries_total{model_name="m"} 1\n'
     'vllm:prefix_cache_queries_total{model_name="m"} 2\n', "parse"),
    ('vllm:prefix_cache_queries_total{model_name="m"} NaN\n', "invalid_value"),
    ('vllm:prefix_cache_queries_total{model_name="m"} -5\n', "invalid_value"),
    ('vllm:prefix_cache_queries_total{model_name="m"} twelve\n', "parse"),
    ('vllm:prefix_cache_queries_total{model_name="m} 1\n', "parse"),
    ('vllm:prefix_cache_queries_total{model_name="m"} 1\n'
     'vllm:time_to_first_token_seconds_bucket{model_name="m",le="0.1"} 1\n', "parse"),
])
def test_bad_pages(body: str, reason: str) -> None:
    with pytest.raises(PageError) as info:
        read_page(body)
    assert info.value.reason == reason


def test_truncated_fixture_is_rejected(vllm_page: str) -> None:
    cut = vllm_page.index("vllm:prefix_cache_hits_total{") + 40
    with pytest.raises(PageError) as info:
        read_page(vllm_page[:cut])
    assert info.value.reason == "parse"


def test_nan_gauge_is_dropped_not_fatal(vllm_page: str) -> None:
    page = vllm_page.replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0',
        'vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} NaN')
    values = read_page(page).series[(MODEL, "0")]
    assert "kv_usage" not in values.gauges and values.counters["hits"] == 7168


def test_detect_prefers_current_names() -> None:
    both = ('vllm:gpu_prefix_cache_hit_rate{model_name="m"} 0.2\n'
            'vllm:prefix_cache_queries_total{model_name="m"} 5\n')
    assert detect_schema(both) is schemas.VLLM_V1


label_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"),
                     max_size=30)


@settings(max_examples=150, deadline=None)
@given(model=label_text, queries=st.integers(0, 10**12), hits=st.integers(0, 10**12),
       extra=st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,8}", fullmatch=True), label_text,
                             max_size=3))
def test_labels_round_trip(model: str, queries: int, hits: int, extra: dict[str, str]) -> None:
    """Any label value client_python can write is read back exactly."""
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    extra = {k: v for k, v in extra.items() if k not in ("model_name", "engine")}
    reg = CollectorRegistry()
    names = ["model_name", "engine", *sorted(extra)]
    q = Counter("vllm:prefix_cache_queries", "q", names, registry=reg)
    h = Counter("vllm:prefix_cache_hits", "h", names, registry=reg)
    q.labels(model, "0", *[extra[k] for k in sorted(extra)]).inc(queries)
    h.labels(model, "0", *[extra[k] for k in sorted(extra)]).inc(hits)
    snap = read_page(generate_latest(reg).decode())
    values = snap.series[(model, "0")]
    assert values.counters["queries"] == queries and values.counters["hits"] == hits
