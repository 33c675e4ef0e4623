"""The simulator as SGLang (``--engine sglang``): its radix cache reproduces the SGLang manual's
three-layout table, its usage field, /metrics counters and KV event stream are SGLang's."""

from __future__ import annotations

import random
import statistics
import time

import msgspec
import pytest
import requests

from prefixwatch.core.kv.codec import BatchDecoder
from prefixwatch.exporter.pagereader import read_page
from prefixwatch.simulator.driver import tokenize_work
from prefixwatch.simulator.engine import EngineConfig, VirtualClock
from prefixwatch.simulator.kvpublisher import KVEvents
from prefixwatch.simulator.scenarios import LAYOUTS, SCENARIOS, layout_prompt
from prefixwatch.simulator.server import Replica, ReplicaServer
from prefixwatch.simulator.sglangengine import SGLangEngine
from prefixwatch.simulator.sglangevents import SGLangEventSink, encode_sglang_batch

WARM = 5  # warm requests per layout, as the manual's table


def _medians(server: ReplicaServer, rounds: int) -> dict[str, float]:
    """Send the three-layouts scenario's requests one at a time; each layout's median cached
    tokens over its warm requests (the first of each is cold; the scenario takes the layouts
    in turn from wherever an earlier run of it left off)."""
    make = SCENARIOS["three-layouts"].make
    rng = random.Random(1)
    got: dict[str, list[int]] = {layout: [] for layout in LAYOUTS}
    for _ in range(3 * rounds):
        work = make(rng, None, None)  # type: ignore[arg-type]  # the layouts in turn
        r = requests.post(f"http://127.0.0.1:{server.port}/v1/completions", json=work.body,
                          timeout=10)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        assert usage["prompt_tokens"] == 2999
        details = usage["prompt_tokens_details"]
        got[work.route_key].append(details["cached_tokens"] if details else 0)
    return {layout: statistics.median(v[1:]) for layout, v in got.items()}


@pytest.fixture
def serve():
    started: list[ReplicaServer] = []

    def start(engine: str) -> ReplicaServer:
        cfg = EngineConfig(prefill_tokens_per_s=1e6, time_per_output_token=0.0005)
        srv = ReplicaServer(Replica(cfg, server=engine), "127.0.0.1", 0)
        srv.start()
        started.append(srv)
        return srv
    yield start
    for srv in started:
        srv.stop()


def test_the_manuals_three_layouts_give_its_medians_exactly(serve) -> None:
    """SGLang's manual: median cached tokens 2998 (the same prompt), 5 (a random id after the
    first 5 tokens), 2985 (the id after the first 2,985)."""
    assert _medians(serve("sglang"), 1 + WARM) == {
        "same-prompt": 2998, "id-at-start": 5, "id-at-end": 2985}


def test_vllms_rule_on_the_same_table_is_whole_blocks() -> None:
    """The vLLM engine is unchanged: 16-token blocks give 2992, 0 and 2976 on that table."""
    srv = ReplicaServer(Replica(EngineConfig(prefill_tokens_per_s=1e6,
                                             time_per_output_token=0.0005)), "127.0.0.1", 0)
    srv.start()
    try:
        assert _medians(srv, 3) == {"same-prompt": 2992, "id-at-start": 0, "id-at-end": 2976}
    finally:
        srv.stop()


def test_page_size_matches_whole_pages() -> None:
    replica = Replica(EngineConfig(), server="sglang")
    engine = SGLangEngine(EngineConfig(page_size=16), VirtualClock())
    rng = random.Random(2)
    cached: dict[str, list[int]] = {layout: [] for layout in LAYOUTS}
    for i in range(9):
        layout = LAYOUTS[i % 3]
        prompt, _ = tokenize_work(replica, {"prompt": layout_prompt(layout, rng)})
        req = engine.submit(prompt, 4)
        engine.run_until_idle()
        cached[layout].append(req.cached_tokens)
    assert {k: v[-1] for k, v in cached.items()} == {
        "same-prompt": 2992, "id-at-start": 0, "id-at-end": 2976}


def _page(srv: ReplicaServer) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families
    text = requests.get(f"http://127.0.0.1:{srv.port}/metrics", timeout=5).text
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))):
            s.value for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_usage_and_counters_move_as_sglangs(serve) -> None:
    srv = serve("sglang")
    prompt = list(range(1000, 1300))
    sent = []
    for _ in range(3):
        r = requests.post(f"http://127.0.0.1:{srv.port}/v1/completions",
                          json={"prompt": prompt, "max_tokens": 6}, timeout=10)
        sent.append(r.json()["usage"])
    # SGLang leaves the details out while nothing was cached, then reports len - 1.
    assert sent[0]["prompt_tokens_details"] is None
    assert [u["prompt_tokens_details"]["cached_tokens"] for u in sent[1:]] == [299, 299]
    page = _page(srv)
    assert page[("sglang:prompt_tokens_total", ())] == 900
    assert page[("sglang:generation_tokens_total", ())] == 18
    assert page[("sglang:cached_tokens_total", (("cache_source", "device"),))] == 598
    assert ("sglang:cached_tokens_total", (("cache_source", "host"),)) not in page
    assert page[("sglang:num_requests_total", ())] == 3
    assert page[("sglang:cache_hit_rate", ())] == pytest.approx(299 / 300)
    snap = read_page(requests.get(f"http://127.0.0.1:{srv.port}/metrics", timeout=5).text)
    series = snap.series[(EngineConfig().model, "0")]
    assert series.counters["finished_requests"] == 3


def test_counters_wait_for_the_request_to_finish() -> None:
    """SGLang's tokenizer manager counts a request's tokens when it finishes; the TTFT
    histogram and the hit-rate gauge move at its prefill."""
    replica = Replica(EngineConfig(time_per_output_token=10.0), server="sglang")
    req = replica.submit(list(range(500, 600)), 3, None)
    deadline = time.monotonic() + 5
    while req.first_token_at is None and time.monotonic() < deadline:
        replica.engine.step()
        time.sleep(0.002)
    text = replica.metrics.render().decode()
    assert 'sglang:prompt_tokens_total{model_name="' in text
    snap = read_page(text)
    series = snap.series[(EngineConfig().model, "0")]
    assert series.counters["queries"] == 0 and series.histograms["ttft"].count == 1


class Collect:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def publish(self, events) -> None:
        self.payloads.append(encode_sglang_batch(events))

    def restart(self) -> None:
        pass


def test_the_kv_events_are_sglangs_positional_pages() -> None:
    engine = SGLangEngine(EngineConfig(num_blocks=2, block_size=4), VirtualClock())
    sink = Collect()
    engine.attach_kv_events(KVEvents(SGLangEventSink(), sink))
    engine.submit([7, 8, 9], 2)  # 3 + 2 - 1 = 4 tokens of KV: 4 one-token pages
    engine.run_until_idle()
    engine.submit([1, 2, 3, 4, 5, 6], 1)  # needs 7 of the 8 slots: evicts the first run
    engine.run_until_idle()
    raw = [msgspec.msgpack.decode(p) for p in sink.payloads]
    assert all(len(batch) == 3 and batch[2] == 0 for batch in raw)  # [ts, events, dp rank]
    events = [e for batch in raw for e in batch[1]]
    assert events[0] == ["AllBlocksCleared"]
    stored = [e for e in events if e[0] == "BlockStored"]
    assert [e[3] for e in stored[:4]] == [[7], [8], [9], [stored[3][3][0]]]
    assert all(len(e) == 7 and len(e[1]) == 1 and e[4] == 1 and e[5] is None
               and e[6] == "GPU" for e in stored)
    assert stored[0][2] is None and stored[1][2] == stored[0][1][0]  # the page chain
    removed = [e for e in events if e[0] == "BlockRemoved"]
    # Leaves go first: the answer's node, then the prompt's (every page of it).
    assert [e[1][0] for e in removed] == [e[1][0] for e in (stored[3], *stored[:3])]
    assert all(e[2] == "GPU" for e in removed)
    # The exporter's decoder reads them as positional events.
    decoded = [BatchDecoder().decode(p) for p in sink.payloads]
    assert sum(len(b.events) for b in decoded) == len(events)


def test_the_hicache_host_pool_serves_what_the_device_evicted() -> None:
    cfg = EngineConfig(num_blocks=40, block_size=16, offload_blocks=400)
    engine = SGLangEngine(cfg, VirtualClock())
    sink = Collect()
    engine.attach_kv_events(KVEvents(SGLangEventSink(), sink))
    first = list(range(10_000, 10_400))
    for prompt in (first, list(range(20_000, 20_400)), first):
        req = engine.submit(prompt, 2)
        engine.run_until_idle()
    # The device pool (640 tokens) could not keep the first prompt beside the second; the
    # host pool wrote it through and serves it back.
    assert req.external_cached_tokens > 300 and req.cached_tokens == 399
    media = {e[6] for p in sink.payloads for e in msgspec.msgpack.decode(p)[1]
             if e[0] == "BlockStored"}
    assert media == {"GPU", "CPU_PINNED"}


@pytest.mark.parametrize("caching", [True, False])
def test_every_slot_comes_back(caching: bool) -> None:
    """What requests held goes back to the pool or stays in the tree, evictable, once they
    finish (with the radix cache off, all of it back to the pool)."""
    engine = SGLangEngine(EngineConfig(num_blocks=64, block_size=16, page_size=4,
                                       enable_prefix_caching=caching), VirtualClock())
    rng = random.Random(5)
    for _ in range(40):
        prompt = [rng.randrange(50) for _ in range(rng.randint(1, 300))]
        engine.submit(prompt, rng.randint(1, 40))
        if rng.random() < 0.5:
            engine.run_until_idle()
    engine.run_until_idle()
    cache = engine.cache
    assert cache.protected == 0 and engine.kv_usage == 0.0
    assert cache.free + cache.evictable == cache.capacity
    assert (cache.evictable > 0) == caching


@pytest.mark.parametrize("argv, message", [
    (["--page-size", "4"], "--page-size is SGLang's"),
    (["--engine", "sglang", "--page-size", "0"], "--page-size must be >= 1"),
])
def test_bad_page_sizes_are_one_line_errors(argv: list[str], message: str) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "prefixwatch.cli", "simulate", "--port", "0",
                        "--rate", "0", "--duration", "1s", *argv],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr


def test_reset_prefix_cache_empties_the_radix_tree() -> None:
    """POST /reset_prefix_cache on an SGLang replica forgets what its radix tree holds (the
    store SGLang caches in), not only the vLLM block pool it never uses."""
    engine = SGLangEngine(EngineConfig(num_blocks=64, block_size=16), VirtualClock())
    prompt = list(range(1, 200))
    for _ in range(2):
        req = engine.submit(prompt, 4)
        engine.run_until_idle()
    assert req.cached_tokens > 0
    assert engine.reset_prefix_cache()
    assert engine.kv_usage == 0.0
    req = engine.submit(prompt, 4)
    engine.run_until_idle()
    assert req.cached_tokens == 0
