"""The simulator's host tier: vLLM 0.33's connector families and counters, SGLang's HiCache."""

from __future__ import annotations

import random
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.logs.builtin_tokenizer import Tokenizer, apply_chat_template
from prefixwatch.core.vocab import families as table
from prefixwatch.core.vocab import tiers
from prefixwatch.exporter.pagereader import read_page
from prefixwatch.simulator.engine import Engine, EngineConfig, VirtualClock
from prefixwatch.simulator.metrics import PageMetrics
from prefixwatch.simulator.scenarios import SCENARIOS, Corpus
from prefixwatch.simulator.server import Replica, ReplicaServer
from tests.simulator.test_simulator import families

FIXTURE = Path(__file__).parent.parent / "fixtures" / "vllm_metrics_cpu_offload.txt"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def evicting_prompts(rng: random.Random, n: int) -> list[list[int]]:
    """A 2,400-token shared prompt, then two unrelated ~3,000-token prompts, repeated: a
    400-block device pool loses the shared blocks between two uses (the fixture's workload)."""
    shared = [rng.randrange(256, 1000) for _ in range(2400)]
    out = []
    for i in range(n):
        if i % 3 == 0:
            out.append(shared + [rng.randrange(256, 1000) for _ in range(100)])
        else:
            out.append([rng.randrange(256, 1000) for _ in range(rng.randint(2800, 3200))])
    return out


def run_sequential(engine: Engine, prompts: list[list[int]], max_tokens: int = 4) -> list[int]:
    """Each request alone, to completion; returns each request's cached_tokens."""
    cached = []
    for prompt in prompts:
        req = engine.submit(prompt, max_tokens)
        engine.run_until_idle(step=0.01)
        cached.append(req.cached_tokens)
    return cached


def samples(page: str) -> dict[tuple[str, str], float]:
    """(sample name, source or cache_source label) -> value, for vllm:* and sglang:*."""
    out: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            key = (s.name, s.labels.get("source", s.labels.get("cache_source", "")))
            out[key] = out.get(key, 0.0) + s.value
    return out


def offload_engine(num_blocks: int = 400, offload_blocks: int = 8192,
                   server: str = "vllm") -> tuple[Engine, PageMetrics]:
    engine = Engine(EngineConfig(model=MODEL, num_blocks=num_blocks, max_model_len=4096,
                                 offload_blocks=offload_blocks, time_per_output_token=0.001),
                    clock=VirtualClock())
    return engine, PageMetrics(engine, server)


# -- vLLM's page, family by family --------------------------------------------------------------


@pytest.fixture(scope="module")
def offload_page() -> str:
    engine, metrics = offload_engine()
    run_sequential(engine, evicting_prompts(random.Random(1), 12))
    return metrics.render().decode()


def test_page_matches_vllm_with_cpu_offload_family_by_family(offload_page: str) -> None:
    ours = families(offload_page)
    real = families(FIXTURE.read_text())
    assert set(ours) == set(real)
    for name, want in real.items():
        assert ours[name] == want, name


def test_page_lines_match_vllm_with_cpu_offload_order_and_format(offload_page: str) -> None:
    ours = [line for line in offload_page.splitlines()
            if line.startswith("# ") and " vllm:" in line]
    real = [line for line in FIXTURE.read_text().splitlines()
            if line.startswith("# ") and " vllm:" in line]
    assert ours == real
    assert ('vllm:simple_kv_offload_info{backend="cpu",capacity_blocks="8192",engine="0",'
            f'lazy_offload="false",model_name="{MODEL}",page_cache="false"}} 1.0'
            in offload_page)
    assert 'simple_cpu_offload_num_blocks="8192"' in offload_page


def test_without_offload_the_page_has_no_connector_families() -> None:
    page = Replica(EngineConfig()).metrics.render().decode()
    assert "simple_kv_offload" not in page and "kv_fetch_by_stage" not in page
    assert 'simple_cpu_offload_num_blocks="None"' in page


# -- the counters add up -------------------------------------------------------------------------


def v1(role: str) -> str:
    return table.read(role, table.VLLM_V1)


def test_counters_add_up_as_vllm_says() -> None:
    engine, metrics = offload_engine()
    cached = run_sequential(engine, evicting_prompts(random.Random(2), 30))
    engine.step()  # the last loads finish
    v = samples(metrics.render().decode())
    queries = v[(v1("queries"), "")]
    device = v[(v1("hits"), "")]
    external = v[(v1("ext_hits"), "")]
    assert device > 0 and external > 0
    by_source = {s: v[(tiers.VLLM_CACHED_BY_SOURCE, s)] for s in tiers.VLLM_CACHED_SOURCES}
    assert sum(by_source.values()) == device + external
    assert by_source["host"] == external and by_source["device"] == device
    assert v[(v1("ext_queries"), "")] == queries - device
    assert v[(v1("prompt_tokens_cached"), "")] == device + external == sum(cached)
    prompt = {s: v[(tiers.VLLM_PROMPT_BY_SOURCE, s)] for s in tiers.VLLM_PROMPT_SOURCES}
    assert sum(prompt.values()) == queries
    assert prompt["external_kv_transfer"] == external
    assert v[(tiers.VLLM_OFFLOAD_LOAD_BLOCKS, "")] * 16 == external
    assert v[(tiers.VLLM_OFFLOAD_PENDING_STORE_BLOCKS, "")] == 0
    assert v[(tiers.VLLM_OFFLOAD_USED_BLOCKS, "")] == 0
    # The shared prompt comes back from host memory every time after its first use.
    assert cached[3] == cached[6] == 2400 and engine.stats.ext_hits > 0


def test_host_tier_is_lru_and_bounded() -> None:
    """A host tier smaller than the working set evicts its least recently used blocks."""
    engine, metrics = offload_engine(offload_blocks=200)
    run_sequential(engine, evicting_prompts(random.Random(3), 30))
    tier = engine.offload
    assert tier is not None
    assert tier.held_blocks <= 200 and tier.evicted_blocks > 0
    # Two unrelated prompts (~380 blocks) pass through between uses: the shared prompt's
    # blocks are gone from a 200-block host tier too.
    assert engine.stats.ext_hits == 0


def test_device_plus_host_is_an_unlimited_cache_on_sequential_requests() -> None:
    """Without host eviction, a small device pool plus the host tier serves exactly what an
    unlimited device pool would."""
    for seed in range(3):
        rng = random.Random(seed)
        prompts = evicting_prompts(rng, 9) + [p[:rng.randrange(20, len(p))]
                                              for p in evicting_prompts(rng, 6)]
        tiered, _ = offload_engine(num_blocks=400, offload_blocks=100_000)
        unlimited, _ = offload_engine(num_blocks=100_000, offload_blocks=0)
        assert run_sequential(tiered, prompts) == run_sequential(unlimited, prompts)


def test_without_eviction_the_host_tier_changes_nothing() -> None:
    prompts = evicting_prompts(random.Random(4), 12)
    with_host, _ = offload_engine(num_blocks=100_000)
    without, _ = offload_engine(num_blocks=100_000, offload_blocks=0)
    assert run_sequential(with_host, prompts) == run_sequential(without, prompts)
    assert with_host.stats.ext_hits == 0 and with_host.stats.ext_queries > 0
    assert with_host.stats.prefix_hits == without.stats.prefix_hits


def test_restart_empties_the_host_tier() -> None:
    engine, _ = offload_engine()
    run_sequential(engine, evicting_prompts(random.Random(5), 6))
    assert engine.offload is not None and engine.offload.cached
    engine.restart()
    assert not engine.offload.cached and engine.offload.load_blocks == 0


# -- scenarios -----------------------------------------------------------------------------------


def run_scenario(name: str, seconds: float = 60.0, rate: float = 4.0,
                 offload: bool = True) -> Engine:
    """A scenario's Poisson arrivals through one engine in virtual time."""
    scenario = SCENARIOS[name]
    tok, corpus, rng = Tokenizer(), Corpus.build(), random.Random(1)
    clock = VirtualClock()
    engine = Engine(EngineConfig(num_blocks=scenario.num_blocks or 8192,
                                 offload_blocks=scenario.offload_blocks if offload else 0),
                    clock=clock)
    arrival = rng.expovariate(rate)
    while clock.now < seconds:
        while arrival <= clock.now:
            body = scenario.make(rng, corpus, datetime.now(UTC)).body
            ids = tok.encode(apply_chat_template(body["messages"], body.get("tools"), True))
            engine.submit(ids, body.get("max_tokens", 32))
            arrival += rng.expovariate(rate)
        engine.step()
        clock.now += 0.01
    engine.run_until_idle()
    return engine


def test_offload_rescue_keeps_the_effective_ratio_high() -> None:
    st = run_scenario("offload-rescue").stats
    device, host = st.prefix_hits / st.prefix_queries, st.ext_hits / st.prefix_queries
    assert 0.3 < device < 0.55 and 0.3 < host < 0.6
    assert device + host > 0.75  # above the 70% threshold, where the device ratio is not
    alone = run_scenario("offload-rescue", offload=False).stats
    assert alone.prefix_hits / alone.prefix_queries < 0.55


def test_offload_idle_stores_but_serves_nothing() -> None:
    engine = run_scenario("offload-idle", seconds=30.0)
    st, tier = engine.stats, engine.offload
    assert tier is not None and tier.stored_blocks > 1000
    assert st.prefix_hits / st.prefix_queries < 0.05
    assert st.ext_hits / st.ext_queries < 0.02 and tier.load_blocks == st.ext_hits // 16


# -- SGLang, HTTP, CLI ---------------------------------------------------------------------------


def test_sglang_page_splits_cached_tokens_by_source_with_hicache() -> None:
    engine, metrics = offload_engine(server="sglang")
    run_sequential(engine, evicting_prompts(random.Random(6), 12))
    engine.step()
    page = metrics.render().decode()
    v = samples(page)
    host = v[(tiers.SGLANG_CACHED_BY_SOURCE, "host")]
    device = v[(tiers.SGLANG_CACHED_BY_SOURCE, "device")]
    assert host == engine.stats.ext_hits > 0 and device == engine.stats.prefix_hits > 0
    sched = 'engine_type="unified",model_name="{}",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
    assert (f"sglang:hicache_host_total_tokens{{{sched.format(MODEL)}}} "
            f"{8192 * 16:.1f}") in page
    assert v[(tiers.SGLANG_LOAD_BACK_TOKENS, "")] == host
    assert v[(tiers.SGLANG_HICACHE_BACKUP_TOKENS, "")] > 0
    assert v[(tiers.SGLANG_EVICTED_TOKENS, "")] > 0
    assert 0 < v[(tiers.SGLANG_HICACHE_HOST_USED, "")] <= 8192 * 16
    assert "# HELP sglang:cached_tokens_total Number of cached prompt tokens by source " \
           "(device/host/storage)." in page
    snap = read_page(page)  # the exporter's device hits are the device source only
    assert snap.series[(MODEL, "0")].counters["hits"] == device


def test_usage_cached_tokens_include_host_hits_over_http() -> None:
    replica = Replica(EngineConfig(num_blocks=400, max_model_len=4096, offload_blocks=4096,
                                   time_per_output_token=0.001))
    srv = ReplicaServer(replica, "127.0.0.1", 0)
    srv.start()
    try:
        url = f"http://127.0.0.1:{srv.port}/v1/completions"
        usage = []
        for prompt in evicting_prompts(random.Random(7), 4):
            r = requests.post(url, json={"prompt": prompt, "max_tokens": 2}, timeout=10)
            usage.append(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        page = requests.get(f"http://127.0.0.1:{srv.port}/metrics", timeout=10).text
    finally:
        srv.stop()
    assert usage[3] == 2400 and usage[0] == 0  # the device had lost part of it
    v = samples(page)
    host = v[(tiers.VLLM_CACHED_BY_SOURCE, "host")]
    assert host > 0 and host + v[(tiers.VLLM_CACHED_BY_SOURCE, "device")] == sum(usage)


def test_cli_rejects_a_negative_host_tier_and_lists_the_scenarios() -> None:
    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "prefixwatch.cli", "simulate", *args],
                              capture_output=True, text=True, timeout=30)

    r = run("--offload-blocks", "-1", "--duration", "1s")
    assert r.returncode == 2 and "--offload-blocks" in r.stderr and "Traceback" not in r.stderr
    r = run("--list-scenarios")
    assert "offload-rescue" in r.stdout and "host tier 8192 blocks" in r.stdout
