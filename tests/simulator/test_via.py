"""`simulate --via URL` (requests through a router) and vLLM's POST /reset_prefix_cache."""

from __future__ import annotations

import time

import pytest
import requests

from prefixwatch.core.kv.codec import AllBlocksCleared
from prefixwatch.simulator.driver import Driver
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.scenarios import SCENARIOS
from prefixwatch.simulator.server import Replica, ReplicaServer
from prefixwatch.simulator.via import ViaRouter, check_via, endpoint_for
from tests.conftest import refused_port
from tests.simulator.test_simulator import run_cli

FAST = EngineConfig(prefill_tokens_per_s=2e5, time_per_output_token=0.001)


@pytest.fixture
def server():
    s = ReplicaServer(Replica(FAST), "127.0.0.1", 0)
    s.start()
    yield s
    s.stop()


def test_via_sends_each_body_to_its_route_and_names_the_model(server) -> None:
    via = ViaRouter(f"http://127.0.0.1:{server.port}/", FAST.model)
    chat = via.send({"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 2})
    assert chat["object"] == "chat.completion" and chat["model"] == FAST.model
    done = via.send({"prompt": "a b c d", "max_tokens": 2})
    assert done["object"] == "text_completion"
    assert endpoint_for({"prompt": "x"}) == "/v1/completions"
    via.close()


def test_a_driver_via_a_router_counts_what_it_sent(server) -> None:
    driver = Driver([server.replica], SCENARIOS["static-system-prompt"], rate=50, seed=2,
                    via=f"http://127.0.0.1:{server.port}")
    driver.start()
    deadline = time.monotonic() + 10
    while driver.via.sent < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    driver.stop()
    assert driver.via.sent >= 5 and driver.via.failed == 0
    assert server.replica.engine.stats.prefix_queries > 0  # the replica served them


def test_via_a_router_that_is_down_or_silent_counts_failures_and_drops(caplog) -> None:
    import socket

    with refused_port() as port:
        via = ViaRouter(f"http://127.0.0.1:{port}", timeout=1.0)
        assert via.submit({"prompt": "x"})
        deadline = time.monotonic() + 5
        while via.failed < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        via.close()
    assert via.failed == 1 and via.sent == 0
    assert "--via: a request through" in caplog.text
    # A router that accepts and never answers holds the one slot until the deadline: the
    # next request is dropped and counted, not queued.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        via = ViaRouter(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=1.0,
                        max_in_flight=1)
        assert via.submit({"prompt": "x"})
        assert not via.submit({"prompt": "y"}) and via.dropped == 1
        via.close()


@pytest.mark.parametrize("url", ["ftp://router:1", "router:30000", "http://"])
def test_a_bad_via_url_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="not an http"):
        check_via(url)


def test_simulate_rejects_a_bad_via_in_one_line() -> None:
    r = run_cli("simulate", "--via", "router:30000", "--port", "0", "--duration", "1s")
    assert r.returncode == 2 and "not an http(s) URL" in r.stderr
    assert "Traceback" not in r.stderr


def test_reset_prefix_cache_clears_the_cache_and_publishes_it(server) -> None:
    base = f"http://127.0.0.1:{server.port}"
    body = {"prompt": "one two three four five six seven eight " * 8, "max_tokens": 1}
    requests.post(f"{base}/v1/completions", json=body, timeout=10)
    again = requests.post(f"{base}/v1/completions", json=body, timeout=10).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert requests.post(f"{base}/reset_prefix_cache", timeout=10).status_code == 200
    after = requests.post(f"{base}/v1/completions", json=body, timeout=10).json()
    assert after["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_reset_prefix_cache_publishes_all_blocks_cleared() -> None:
    from prefixwatch.simulator.kvpublisher import KVEvents, KVEventSink

    sent = []

    class Publisher:
        def publish(self, events):
            sent.extend(events)

    replica = Replica(FAST)
    replica.engine.attach_kv_events(KVEvents(KVEventSink(FAST.block_size), Publisher()))
    assert replica.engine.reset_prefix_cache()
    assert any(isinstance(e, AllBlocksCleared) for e in sent)
