"""The tier table: engine sources to prefixwatch tiers, fallbacks, ratios, schema roles."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.vocab import exposition, families, schemas, tiers

FIXTURE = Path(__file__).parent.parent / "fixtures" / "vllm_metrics_cpu_offload.txt"


@pytest.mark.parametrize(("source", "tier"), [
    ("device", "device"), ("host", "host"), ("disk", "disk"), ("p2p", "remote"),
    ("external_unspecified", "unknown"), ("something_new", "unknown")])
def test_vllm_sources(source: str, tier: str) -> None:
    assert tiers.vllm_source_tier(source) == tier


@pytest.mark.parametrize(("source", "tier"), [
    ("device", "device"), ("host", "host"), ("storage_file", "disk"),
    ("storage_mooncake", "remote"), ("storage_hf3fs", "remote"), ("storage_nixl", "remote"),
    ("storage_unknown", "unknown"), ("total", "unknown"), ("shared_hicache", "unknown")])
def test_sglang_sources(source: str, tier: str) -> None:
    assert tiers.sglang_source_tier(source) == tier


def test_every_vllm_source_has_a_tier_and_every_tier_is_known() -> None:
    mapped = {tiers.vllm_source_tier(s) for s in tiers.VLLM_CACHED_SOURCES}
    assert mapped == set(tiers.TIERS)
    for backend in tiers.SGLANG_STORAGE_BACKENDS:
        assert tiers.sglang_source_tier(f"storage_{backend}") in (tiers.TIER_DISK,
                                                                   tiers.TIER_REMOTE)


def v1(role: str) -> str:
    return families.read(role, families.VLLM_V1)


def test_fixture_by_source_sums_to_device_plus_external_and_maps_to_tiers() -> None:
    """vLLM 0.33 with its CPU connector: the by-source split adds up, host is the host tier."""
    values: dict[str, dict[str, float]] = {}
    for fam in text_string_to_metric_families(FIXTURE.read_text()):
        for s in fam.samples:
            key = s.labels.get("source", "")
            values.setdefault(s.name, {})[key] = s.value
    by_source = values[tiers.VLLM_CACHED_BY_SOURCE]
    device = values[v1("hits")][""]
    external = values[v1("ext_hits")][""]
    queries = values[v1("queries")][""]
    assert sum(by_source.values()) == device + external
    assert values[v1("ext_queries")][""] == queries - device
    got = tiers.tiers_from_sources(by_source, "vllm")
    assert got == {"device": 171536, "host": 58864, "disk": 0, "remote": 0, "unknown": 0}
    fallback = tiers.vllm_fallback_tiers(device, external)
    assert sum(fallback.values()) == sum(got.values())
    assert fallback["device"] == got["device"] and fallback["unknown"] == got["host"]
    prompt = values[tiers.VLLM_PROMPT_BY_SOURCE]
    assert sum(prompt.values()) == queries
    assert prompt[tiers.VLLM_PROMPT_SOURCE_COMPUTED] == queries - device - external
    assert tiers.effective_ratio(got, queries) == pytest.approx(230400 / 504464)
    assert tiers.VLLM_OFFLOAD_LOAD_BLOCKS in values
    assert values[tiers.VLLM_OFFLOAD_LOAD_BLOCKS][""] * 16 == external


def test_sglang_sources_sum_per_tier() -> None:
    got = tiers.tiers_from_sources(
        {"device": 100, "host": 40, "storage_file": 7, "storage_mooncake": 3, "total": 2},
        "sglang")
    assert got == {"device": 100, "host": 40, "disk": 7, "remote": 3, "unknown": 2}


def test_effective_ratio_edges() -> None:
    assert tiers.effective_ratio(tiers.empty_tiers(), 0) is None
    assert tiers.effective_ratio({"device": 5.0}, 10) == 0.5
    assert tiers.effective_ratio({"device": 20.0}, 10) == 1.0  # counters read mid-update
    assert tiers.vllm_fallback_tiers(3.0, None)["unknown"] == 0.0


def test_schema_roles_name_the_fixture_families() -> None:
    page = FIXTURE.read_text()
    for name in schemas.VLLM_TIERS.sample_names():
        if name.startswith("vllm:simple_kv_offload_save_outcomes"):
            continue  # declared, no sample yet: vLLM counts only boundary hand-off stores
        assert f"\n{name}{{" in page, name
    assert schemas.TIER_SCHEMAS["sglang"].cached_by_source == "sglang:cached_tokens_total"
    assert set(tiers.VLLM_OFFLOAD_OUTCOMES_FAILED).isdisjoint(tiers.VLLM_OFFLOAD_OUTCOMES_SKIPPED)


def test_output_metrics_carry_tier_and_window() -> None:
    tiered = exposition.OUT_PROMPT_TOKENS_CACHED
    assert tiered.labels == (*exposition.OUT_PROMPT_TOKENS.labels, exposition.L_TIER)
    assert exposition.OUT_EFFECTIVE_HIT_RATIO.labels == exposition.OUT_HIT_RATIO.labels
    assert exposition.OUT_FLEET_EFFECTIVE_HIT_RATIO.labels == exposition.OUT_FLEET_HIT_RATIO.labels
