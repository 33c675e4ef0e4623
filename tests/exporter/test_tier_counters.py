"""Every cache tier counts: the exporter's tier counters against the engines' own by-source
counters, on pages in each engine's exact format, and the effective ratio next to the device
one over windows, restarts and the fleet."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.vocab import tiers
from prefixwatch.exporter.evidence import evidence_for
from prefixwatch.exporter.status import StatusRow, render
from tests.exporter.test_exporter import make_exporter, pick, samples

FIXTURES = Path(__file__).parents[1] / "fixtures"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CACHED = "prefixwatch_prompt_tokens_cached_total"
BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def engine_sources(text: str, family: str, label: str) -> dict[str, float]:
    """The engine's own cached tokens by source, read with client_python's parser."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == family and s.labels.get("tp_rank", "0") == "0":
                out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
    return out


def exported_tiers(exporter, target: str | None = None) -> dict[str, float]:
    found = samples(exporter)
    labels = {"target": target} if target else {}
    return {t: sum(pick(found, CACHED, tier=t, **labels)) for t in tiers.TIERS
            if pick(found, CACHED, tier=t, **labels)}


def with_values(text: str, values: dict[str, float]) -> str:
    """The page with the samples whose line starts with a key set to its value."""
    out = []
    for line in text.splitlines():
        for prefix, value in values.items():
            if line.startswith(prefix):
                line = line.rsplit(" ", 1)[0] + f" {value}"
        out.append(line)
    return "\n".join(out) + "\n"


def vllm_line(family: str, source: str | None = None) -> str:
    extra = f',source="{source}"' if source else ""
    return f'{family}{{engine="0",model_name="{MODEL}"{extra}}}'


def offload_page(queries: float, device: float, host: float) -> str:
    """The vLLM 0.33 CPU-offload page with consistent counters (by-source = device + host)."""
    return with_values(page("vllm_metrics_cpu_offload.txt"), {
        vllm_line("vllm:prefix_cache_queries_total"): queries,
        vllm_line("vllm:prompt_tokens_total"): queries,
        vllm_line("vllm:prefix_cache_hits_total"): device,
        vllm_line("vllm:external_prefix_cache_queries_total"): queries - device,
        vllm_line("vllm:external_prefix_cache_hits_total"): host,
        vllm_line(BY_SOURCE, "device"): device,
        vllm_line(BY_SOURCE, "host"): host,
    })


def test_vllm_cpu_offload_page_tiers_equal_the_engines_by_source_counters() -> None:
    text = page("vllm_metrics_cpu_offload.txt")
    exporter = make_exporter("http://127.0.0.1:9/metrics")
    exporter.monitors[0].ingest(text, time.time())
    by_source = engine_sources(text, BY_SOURCE, "source")
    assert set(by_source) == set(tiers.VLLM_CACHED_SOURCES)
    want = dict.fromkeys(tiers.TIERS, 0.0)
    for source, value in by_source.items():
        want[tiers.vllm_source_tier(source)] += value
    got = exported_tiers(exporter)
    assert got == want and got["host"] == 58864.0 and got["device"] == 171536.0
    # Summed over tier it is the engine's untiered cached counter, as the old series was.
    assert sum(got.values()) == 230400.0
    found = samples(exporter)
    assert pick(found, "prefixwatch_prefix_cache_hits_total") == [171536.0]  # device, as before
    assert pick(found, "prefixwatch_prompt_tokens_total") == [504464.0]
    assert pick(found, "prefixwatch_effective_hit_ratio", window="lifetime") == [
        pytest.approx(230400 / 504464)]
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", window="lifetime") == [
        pytest.approx(171536 / 504464)]


@pytest.mark.parametrize("fixture,device,unknown", [
    ("vllm_metrics.txt", 7168.0, 0.0),
    ("vllm_metrics_cpu_offload.txt", 171536.0, 58864.0),
])
def test_vllm_page_without_by_source_falls_back(fixture: str, device: float,
                                                unknown: float) -> None:
    """Before vLLM 0.33: device = prefix_cache_hits, unknown = external_prefix_cache_hits;
    on a 0.33 page both readings agree in total."""
    full = page(fixture)
    stripped = "".join(ln for ln in full.splitlines(keepends=True)
                       if "prompt_tokens_cached_by_source" not in ln)
    exporter = make_exporter("http://127.0.0.1:9/metrics")
    exporter.monitors[0].ingest(stripped, time.time())
    got = exported_tiers(exporter)
    assert got == {**dict.fromkeys(tiers.TIERS, 0.0), "device": device, "unknown": unknown}
    assert sum(got.values()) == sum(engine_sources(full, BY_SOURCE, "source").values())


def test_sglang_hicache_page_tiers_equal_the_engines_cache_source_counters() -> None:
    text = page("sglang_metrics_hicache.txt")
    exporter = make_exporter("http://127.0.0.1:9/metrics")
    mon = exporter.monitors[0]
    mon.ingest(text, time.time())
    by_source = engine_sources(text, "sglang:cached_tokens_total", "cache_source")
    assert set(by_source) == {"device", "host", "storage_mooncake"}
    got = exported_tiers(exporter)
    assert got == {**dict.fromkeys(tiers.TIERS, 0.0), "device": by_source["device"],
                   "host": by_source["host"], "remote": by_source["storage_mooncake"]}
    found = samples(exporter)
    # The device ratio is the device pool's: host and storage hits are not its hits.
    assert pick(found, "prefixwatch_prefix_cache_hits_total", server="sglang") == [
        by_source["device"]]
    prompt = pick(found, "prefixwatch_prefix_cache_queries_total")[0]
    assert pick(found, "prefixwatch_effective_hit_ratio", window="lifetime") == [
        pytest.approx(sum(by_source.values()) / prompt)]
    (ev,) = evidence_for(mon.view, time.time(), 60.0).values()
    assert ev.tier_configured and ev.tier_used == 131072.0  # rank 0 only


def test_sglang_page_without_cache_source_is_the_device_tier() -> None:
    """Older SGLang builds have one unlabelled cached-tokens counter: the device tier."""
    text = (f'sglang:prompt_tokens_total{{model_name="{MODEL}"}} 1000.0\n'
            f'sglang:cached_tokens_total{{model_name="{MODEL}"}} 600.0\n')
    exporter = make_exporter("http://127.0.0.1:9/metrics")
    exporter.monitors[0].ingest(text, time.time())
    assert exported_tiers(exporter) == {**dict.fromkeys(tiers.TIERS, 0.0), "device": 600.0}


def test_effective_and_device_ratio_over_windows_restarts_and_the_fleet() -> None:
    exporter = make_exporter("http://127.0.0.1:9/metrics", "http://127.0.0.1:10/metrics")
    a, b = exporter.monitors
    t0 = time.time() - 600
    a.ingest(offload_page(100_000, 40_000, 45_000), t0)
    b.ingest(offload_page(10_000, 9_000, 0), t0)
    # A minute later: a's device pool served 300 of 1,000, its host tier 500; b served 90 of
    # 100 from its device pool and has no host hits.
    a.ingest(offload_page(101_000, 40_300, 45_500), t0 + 60)
    b.ingest(offload_page(10_100, 9_090, 0), t0 + 60)
    found = samples(exporter)
    eff = "prefixwatch_effective_hit_ratio"
    assert pick(found, eff, target=a.name, window="1m") == [pytest.approx(0.8)]
    assert pick(found, "prefixwatch_prefix_cache_hit_ratio", target=a.name, window="1m") == [
        pytest.approx(0.3)]
    assert pick(found, eff, target=b.name, window="1m") == [pytest.approx(0.9)]
    # The fleet sums before dividing: (800 + 90) / 1,100, not the mean of 0.8 and 0.9.
    assert pick(found, "prefixwatch_fleet_effective_hit_ratio", window="1m") == [
        pytest.approx(890 / 1100)]
    assert pick(found, "prefixwatch_fleet_prefix_cache_hit_ratio", window="1m") == [
        pytest.approx(390 / 1100)]
    # a restarts: counters from zero; the 5m window keeps what came before and adds the new.
    a.ingest(offload_page(2_000, 200, 1_400), t0 + 90)
    found = samples(exporter)
    assert pick(found, eff, target=a.name, window="5m") == [
        pytest.approx((800 + 1_600) / (1_000 + 2_000))]
    assert min(pick(found, eff)) >= 0 and "NaN" not in str(found.values())
    # Quiet for longer than the window: the ratios are absent, not 0.
    for step in range(1, 4):
        a.ingest(offload_page(2_000, 200, 1_400), t0 + 90 + 40 * step)
    found = samples(exporter)
    assert pick(found, eff, target=a.name, window="1m") == []
    assert pick(found, CACHED, target=a.name, tier="host") == [1_400.0]


def test_status_shows_both_ratios_and_the_tier_split() -> None:
    row = StatusRow("vllm-0", MODEL, "vllm", "vllm_v1", 0.4, 0.41, 100.0, None, None, 0.95,
                    16, True, effective_ratio=0.88, lifetime_effective=0.87,
                    tier_split={"device": 0.4, "host": 0.48, "disk": 0.0, "remote": 0.0,
                                "unknown": 0.0, "recomputed": 0.12})
    text = render([row], 5.0)
    story, blank, header, line = text.splitlines()[:4]
    assert story == (f"{MODEL} (vllm-0): effective hit ratio 88.0% over 5s; cause: none "
                     "diagnosed") and blank == ""
    assert "HIT(5s)" in header and "EFF(5s)" in header and "EFF(life)" in header
    assert "40.0%" in line and "88.0%" in line and "87.0%" in line
    assert "device 40.0%, host 48.0%, recomputed 12.0%" in text
    assert "disk" not in text.split("by cache tier")[1].split("\n\n")[0]
