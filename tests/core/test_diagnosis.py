"""The diagnosis rules, one by one, on figures built by hand and on pages read by a monitor."""

from __future__ import annotations

import math

import pytest

from prefixwatch.core.diagnosis import (
    RequestEvidence,
    TargetEvidence,
    diagnose,
    fraction_at_or_below,
)
from prefixwatch.core.errors import ConfigError
from prefixwatch.core.vocab import settings
from prefixwatch.core.vocab.causes import CAUSE_NAMES, DiagnosisThresholds
from prefixwatch.exporter.config import TargetConfig
from prefixwatch.exporter.evidence import evidence_for
from prefixwatch.exporter.monitor import TargetMonitor

TH = DiagnosisThresholds()
PROMPT_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0,
                 10000.0, 20000.0, math.inf)


def healthy(**changes) -> TargetEvidence:
    ev = TargetEvidence(queries=100_000, hits=88_000, prev_queries=100_000, prev_hits=87_000,
                        caching_enabled=True, block_size=16, kv_peak=0.3, preemptions=0,
                        waiting_first=0, waiting_last=0, waiting_mean=0,
                        prompt_len=(PROMPT_BOUNDS, [0] * 10 + [100] * 5),
                        ttft_p50=0.05, prev_ttft_p50=0.05, ttft_requests=100,
                        prev_ttft_requests=100, seconds_since_start=86_400)
    for key, value in changes.items():
        setattr(ev, key, value)
    return ev


def active(evidence, requests=None, cold=600.0) -> dict[str, list[str]]:
    result = diagnose(evidence, requests or {}, TH, cold)
    return {t: result.active(t, m) for (t, m) in result.causes}


def one(ev: TargetEvidence, req: RequestEvidence | None = None) -> list[str]:
    return active({"a": {"m": ev}}, {"m": req} if req else {})["a"]


def test_healthy_has_no_cause_and_every_cause_is_present() -> None:
    result = diagnose({"a": {"m": healthy()}}, {}, TH, 600)
    assert set(result.causes[("a", "m")]) == set(CAUSE_NAMES)
    assert result.active("a", "m") == []


def test_caching_disabled() -> None:
    assert one(healthy(caching_enabled=False, hits=0)) == ["caching_disabled"]
    assert one(healthy(caching_enabled=None)) == []  # SGLang: not known, not assumed


@pytest.mark.parametrize("changes, expected", [
    ({"kv_peak": 0.97, "preemptions": 3}, ["eviction_pressure"]),
    ({"kv_peak": 0.97, "waiting_first": 2, "waiting_last": 9, "waiting_mean": 5},
     ["eviction_pressure"]),
    ({"kv_peak": 0.97, "waiting_first": 9, "waiting_last": 0, "waiting_mean": 3}, []),  # drained
    ({"kv_peak": 0.97, "evicted_blocks": 40, "evict_idle_median": 4.0}, ["eviction_pressure"]),
    ({"kv_peak": 0.97, "evicted_blocks": 40, "evict_idle_median": 900.0}, []),
    ({"kv_peak": 0.5, "preemptions": 3}, []),  # preempted for other reasons: pool not full
])
def test_eviction_pressure(changes, expected) -> None:
    assert one(healthy(**changes)) == expected


def test_short_prompts_from_the_histogram() -> None:
    # 80 of 100 prompts at most 10 tokens, 20 between 10 and 20: 80 + 20 * 0.6 under 16.
    ev = healthy(prompt_len=(PROMPT_BOUNDS, [0, 0, 0, 80] + [100] * 11), hits=0)
    assert ev.short_share() == pytest.approx(0.92)
    assert one(ev) == ["short_prompts"]
    assert one(healthy(prompt_len=(PROMPT_BOUNDS, [0, 0, 0, 10, 10] + [100] * 10))) == []


def test_prompt_variance_needs_a_low_hit_ratio() -> None:
    # p50 in (200, 500], p99 in (10000, 20000]: a long tail of documents.
    spread = (PROMPT_BOUNDS, [0] * 7 + [10, 90, 95, 96, 97, 98, 100, 100])
    assert one(healthy(prompt_len=spread, hits=20_000)) == ["prompt_variance"]
    assert one(healthy(prompt_len=spread)) == []  # the hit rate is fine


def test_cold_start() -> None:
    assert one(healthy(seconds_since_start=120)) == ["cold_start"]
    assert one(healthy(seconds_since_start=None)) == []


def test_no_ttft_benefit() -> None:
    rose = {"prev_hits": 40_000, "hits": 88_000}
    assert one(healthy(**rose, ttft_p50=0.05, prev_ttft_p50=0.05)) == ["no_ttft_benefit"]
    assert one(healthy(**rose, ttft_p50=0.02, prev_ttft_p50=0.05)) == []  # TTFT fell
    assert one(healthy(**rose, ttft_requests=3)) == []  # too few requests to say


LOGGED_OK = RequestEvidence(requests=100, prompt_tokens=200_000, cacheable_tokens=176_000,
                            long_requests=100, long_prompt_tokens=200_000,
                            long_cacheable_tokens=176_000)


def test_prefix_divergence_from_the_log() -> None:
    bad = RequestEvidence(requests=100, prompt_tokens=200_000, cacheable_tokens=2_000,
                          long_requests=100, long_prompt_tokens=200_000,
                          long_cacheable_tokens=2_000)
    assert one(healthy(hits=1_000), bad) == ["prefix_divergence"]
    few = RequestEvidence(requests=5, prompt_tokens=10_000, long_requests=5,
                          long_prompt_tokens=10_000)
    assert one(healthy(hits=1_000), few) == []


def test_short_prompts_do_not_count_as_divergence() -> None:
    shorts = RequestEvidence(requests=100, prompt_tokens=800, long_requests=0)
    assert "prefix_divergence" not in one(healthy(hits=0), shorts)


def test_gap_on_one_replica_is_eviction() -> None:
    assert one(healthy(hits=30_000), LOGGED_OK) == ["eviction_pressure"]


def test_gap_over_replicas_is_routing_spread_unless_a_pool_is_full() -> None:
    spread = {"a": {"m": healthy(hits=50_000)}, "b": {"m": healthy(hits=50_000)}}
    assert active(spread, {"m": LOGGED_OK}) == {"a": ["routing_spread"], "b": ["routing_spread"]}
    full = {"a": {"m": healthy(hits=50_000, kv_peak=0.99, preemptions=5)},
            "b": {"m": healthy(hits=50_000)}}
    assert active(full, {"m": LOGGED_OK}) == {"a": ["eviction_pressure"], "b": []}
    cold = {"a": {"m": healthy(hits=50_000, seconds_since_start=30)},
            "b": {"m": healthy(hits=50_000)}}
    assert active(cold, {"m": LOGGED_OK}) == {"a": ["cold_start"], "b": []}


def test_no_gap_no_cause() -> None:
    two = {"a": {"m": healthy()}, "b": {"m": healthy()}}
    assert active(two, {"m": LOGGED_OK}) == {"a": [], "b": []}


def test_fraction_at_or_below_interpolates() -> None:
    bounds = (10.0, 20.0, math.inf)
    assert fraction_at_or_below(15, bounds, [4, 8, 10]) == 6
    assert fraction_at_or_below(5, bounds, [4, 8, 10]) == 2
    assert fraction_at_or_below(50, bounds, [4, 8, 10]) == 8


# -- from pages, through a monitor ---------------------------------------------------------------

PAGE = """# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {q}
vllm:prefix_cache_queries_created{{engine="0",model_name="m"}} {created}
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{{engine="0",model_name="m"}} {h}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{engine="0",model_name="m"}} {p}
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {kv}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{engine="0",model_name="m"}} {w}
# TYPE vllm:kv_block_idle_before_evict_seconds histogram
vllm:kv_block_idle_before_evict_seconds_bucket{{engine="0",le="1.0",model_name="m"}} {e1}
vllm:kv_block_idle_before_evict_seconds_bucket{{engine="0",le="10.0",model_name="m"}} {e2}
vllm:kv_block_idle_before_evict_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} {e2}
vllm:kv_block_idle_before_evict_seconds_sum{{engine="0",model_name="m"}} 0
vllm:kv_block_idle_before_evict_seconds_count{{engine="0",model_name="m"}} {e2}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",enable_prefix_caching="{on}",engine="0"}} 1.0
"""


def page(**values) -> str:
    base = {"q": 0, "h": 0, "p": 0, "kv": 0.1, "w": 0, "e1": 0, "e2": 0, "created": 1000.0,
            "on": "True"}
    base.update(values)
    return PAGE.format(**base)


def test_evidence_from_polled_pages() -> None:
    mon = TargetMonitor(TargetConfig("http://x/metrics", name="x"), {}, 1.0,
                        extra_windows=(60.0, 120.0))
    t0 = 10_000.0
    mon.ingest(page(), t0)
    mon.ingest(page(q=1000, h=500, kv=0.95, w=1, e1=30, e2=40), t0 + 30)
    mon.ingest(page(q=2000, h=900, p=2, kv=0.99, w=4, e1=60, e2=80), t0 + 60)
    ev = evidence_for(mon.view, t0 + 60, 60.0)["m"]
    assert (ev.queries, ev.hits, ev.preemptions) == (2000, 900, 2)
    assert ev.kv_peak == 0.99 and (ev.waiting_first, ev.waiting_last) == (0, 4)
    assert ev.evicted_blocks == 80 and ev.evict_idle_median == pytest.approx(0.6667, abs=1e-3)
    assert ev.seconds_since_start == pytest.approx(t0 + 60 - 1000)
    assert ev.caching_enabled is True and ev.block_size == 16
    assert one(ev) == ["eviction_pressure"]
    # A restart (counters back to 0, a new created time) makes the target cold.
    mon.ingest(page(q=10, h=0, created=t0 + 70), t0 + 75)
    ev = evidence_for(mon.view, t0 + 75, 60.0)["m"]
    assert ev.seconds_since_start == pytest.approx(5)
    mon.ingest(page(q=20, on="False", created=t0 + 70), t0 + 80)
    assert evidence_for(mon.view, t0 + 80, 60.0)["m"].caching_enabled is False


def test_hit_ratio_mode_is_one_shared_key() -> None:
    """``hit_ratio: effective|device`` parses once for both config files; default effective."""
    assert settings.diagnosis_from({}, "x").hit_ratio_mode == "effective"
    assert settings.diagnosis_from({"hit_ratio": "device"}, "x").hit_ratio_mode == "device"
    with pytest.raises(ConfigError, match="hit_ratio must be one of effective, device"):
        settings.diagnosis_from({"hit_ratio": "gpu"}, "x")


def tiered(device: float, host: float, **changes) -> TargetEvidence:
    """100,000 prompt tokens: ``device`` from the KV pool, ``host`` from a CPU tier."""
    tiers = {"device": device, "host": host, "disk": 0.0, "remote": 0.0, "unknown": 0.0}
    return healthy(**{"hits": device, "tiers": tiers, "tier_configured": True,
                      "tier_asked": 100_000 - device, **changes})


def test_a_full_pool_whose_misses_the_host_tier_serves_is_not_eviction_pressure() -> None:
    """offload-rescue: 40% device + 48% host. The device view blames eviction; the effective
    one sees 88% served and no cause."""
    ev = tiered(40_000, 48_000, kv_peak=0.97, preemptions=3)
    assert ev.effective_ratio == pytest.approx(0.88) and ev.lower_hits == 48_000
    assert one(ev) == []
    device = diagnose({"a": {"m": ev}}, {}, TH, 600, settings.HIT_RATIO_DEVICE)
    assert device.active("a", "m") == ["eviction_pressure"]
    # Both tiers collapsing is eviction again, whatever the ratio judged.
    assert one(tiered(20_000, 10_000, kv_peak=0.97, preemptions=3)) == ["eviction_pressure"]
    # Without a second tier the effective ratio is the device one: nothing changes.
    assert one(healthy(hits=40_000, kv_peak=0.97, preemptions=3)) == ["eviction_pressure"]


def test_the_requests_log_gap_counts_every_tier() -> None:
    req = RequestEvidence(requests=100, prompt_tokens=100_000, cacheable_tokens=90_000,
                          long_requests=100, long_prompt_tokens=100_000,
                          long_cacheable_tokens=90_000)
    assert one(tiered(40_000, 48_000), req) == []
    assert one(healthy(hits=40_000), req) == ["eviction_pressure"]


def test_tier_idle() -> None:
    """A host tier asked for every device miss that serves under 5% of them."""
    assert one(tiered(1_000, 200)) == ["tier_idle"]
    assert one(tiered(1_000, 20_000)) == []  # it serves: not idle (the ratio is low, though)
    assert one(tiered(80_000, 0)) == []  # the device pool hits: nothing to catch
    assert one(tiered(1_000, 200, tier_configured=False, tier_asked=None)) == []  # no tier
    assert one(tiered(1_000, 200, tier_asked=0.0)) == []  # configured, never fed
    assert one(tiered(1_000, 200, tier_asked=None, tier_stores=5_000.0)) == ["tier_idle"]
    assert one(tiered(1_000, 200, tier_asked=None, tier_used=131_072.0)) == ["tier_idle"]
    few = (PROMPT_BOUNDS, [0] * 10 + [5] * 5)
    assert one(tiered(1_000, 200, prompt_len=few)) == []  # 5 requests prove nothing
    strict = DiagnosisThresholds(tier_idle_hit_share=0.001)
    assert diagnose({"a": {"m": tiered(1_000, 200)}}, {}, strict, 600).active("a", "m") == []


def logged(novel: int, layout: int = 0, routing: int = 0, eviction: int = 0,
           unmeasured: tuple[str, ...] = (), short: int = 0) -> RequestEvidence:
    """100 long requests of 100,000 prompt tokens (plus ``short`` tokens of 20 one-block
    prompts, all novel) with their ledger; the rest of each long prompt is pool reach."""
    from prefixwatch.core.cache.requestledger import Parts

    reach = 100_000 - novel - layout - routing - eviction
    parts = Parts(100_000 + short, novel + short, layout, routing, eviction, reach,
                  requests=100 + (20 if short else 0))
    parts.check()
    return RequestEvidence(requests=parts.requests, prompt_tokens=parts.prompt,
                           cacheable_tokens=100_000 - novel - layout, long_requests=100,
                           long_prompt_tokens=100_000,
                           long_cacheable_tokens=100_000 - novel - layout,
                           ledger=parts, ledger_unmeasured=unmeasured)


def test_ledger_parts_are_the_causes() -> None:
    """Each measured part above its threshold names its cause; the largest missed part decides
    prefix_divergence; a cold or caching-disabled target explains the misses itself."""
    two = {"a": {"m": healthy(hits=45_000, queries=50_000)},
           "b": {"m": healthy(hits=5_000, queries=50_000)}}
    # Layout (35%) is the largest miss and above 1 - 0.7: prefix_divergence; routing 25%.
    both = active(two, {"m": logged(novel=5_000, layout=30_000, routing=25_000)})
    assert both == {"a": ["prefix_divergence", "routing_spread"],
                    "b": ["prefix_divergence", "routing_spread"]}
    # Routing (40%) is the largest: no prefix_divergence although novel + layout is 31%.
    assert active(two, {"m": logged(novel=11_000, layout=20_000, routing=40_000)}) == {
        "a": ["routing_spread"], "b": ["routing_spread"]}
    # Eviction at 25% on one replica whose pool is not visibly full: the ledger says so.
    one_target = healthy(hits=50_000)
    assert one(one_target, logged(novel=5_000, eviction=25_000)) == ["eviction_pressure"]
    assert one(one_target, logged(novel=5_000, eviction=15_000)) == []
    assert one(healthy(hits=50_000, seconds_since_start=5),
               logged(novel=5_000, eviction=25_000)) == ["cold_start"]
    # One-block prompts are wholly novel and never a prefix's fault (short_prompts is).
    assert one(one_target, logged(novel=5_000, short=900_000)) == []


def test_unmeasured_parts_fall_back_to_the_gap() -> None:
    """No replica per request: routing hides in unexplained, and the achievable-achieved gap
    names it as before; a measured routing part of 0 must not be overruled by that gap."""
    two = {t: {"m": healthy(hits=20_000, queries=50_000)} for t in "ab"}
    hidden = logged(novel=10_000, unmeasured=("routing", "eviction"))
    assert active(two, {"m": hidden}) == {"a": ["routing_spread"], "b": ["routing_spread"]}
    measured = logged(novel=10_000, eviction=0)
    assert active(two, {"m": measured}) == {"a": [], "b": []}
