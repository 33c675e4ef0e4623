"""The simulator: vLLM's exact /metrics format, its HTTP API, and bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from prefixwatch.core.logs.builtin_tokenizer import Tokenizer, apply_chat_template
from prefixwatch.exporter.pagereader import read_page
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.scenarios import SCENARIOS
from prefixwatch.simulator.server import Replica, ReplicaServer
from tests.conftest import start_listening


def families(text: str) -> dict[str, tuple[str, str, frozenset[str], tuple[str, ...]]]:
    """vllm:* families: name -> (type, help, label names, bucket bounds)."""
    out = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith("vllm:"):
            continue
        labels: set[str] = set()
        bounds: list[str] = []
        for s in fam.samples:
            labels |= set(s.labels)
            if s.name.endswith("_bucket") and s.labels["le"] not in bounds:
                bounds.append(s.labels["le"])
        out[fam.name] = (fam.type, fam.documentation, frozenset(labels), tuple(bounds))
    return out


def test_metrics_page_matches_vllm_family_by_family(vllm_page: str) -> None:
    replica = Replica(EngineConfig())
    ours = families(replica.metrics.render().decode())
    real = families(vllm_page)
    assert set(ours) == set(real)
    for name, want in real.items():
        assert ours[name] == want, name


def test_metrics_page_lines_match_vllm_order_and_format(vllm_page: str) -> None:
    """Same HELP/TYPE lines in the same order, for every vllm:* family."""
    replica = Replica(EngineConfig(model="meta-llama/Llama-3.1-8B-Instruct", num_blocks=420))
    ours = [line for line in replica.metrics.render().decode().splitlines()
            if line.startswith("# ") and " vllm:" in line]
    real = [line for line in vllm_page.splitlines()
            if line.startswith("# ") and " vllm:" in line]
    assert ours == real
    info = [line for line in replica.metrics.render().decode().splitlines()
            if line.startswith("vllm:cache_config_info{")]
    real_info = [line for line in vllm_page.splitlines()
                 if line.startswith("vllm:cache_config_info{")]
    assert info == real_info


def test_sglang_page_is_read_as_sglang() -> None:
    replica = Replica(EngineConfig(), server="sglang")
    prompt = replica.tokenizer.encode("x " * 100)
    req = replica.submit(prompt, 2, None)
    deadline = time.monotonic() + 5
    while not req.done.is_set() and time.monotonic() < deadline:
        replica.engine.step()  # SGLang counts a request's tokens when it finishes
        time.sleep(0.002)
    snap = read_page(replica.metrics.render().decode())
    assert snap.schema.server == "sglang"
    assert snap.series[(EngineConfig().model, "0")].counters["queries"] == len(prompt)


@pytest.fixture
def server():
    replica = Replica(EngineConfig(num_blocks=2048, max_model_len=4096,
                                   time_per_output_token=0.001),
                      lora_modules=("adapter-a",))
    srv = ReplicaServer(replica, "127.0.0.1", 0)
    srv.start()
    yield srv
    srv.stop()


def post(srv: ReplicaServer, path: str, body, raw: bytes | None = None) -> requests.Response:
    url = f"http://127.0.0.1:{srv.port}{path}"
    if raw is not None:
        return requests.post(url, data=raw, timeout=10,
                             headers={"Content-Type": "application/json"})
    return requests.post(url, json=body, timeout=10)


def test_completions_report_cached_tokens(server: ReplicaServer) -> None:
    prompt = list(range(1000, 3400))  # 2,400 token ids
    first = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 4}).json()
    second = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 4}).json()
    assert first["usage"]["prompt_tokens"] == 2400
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 2384
    assert second["choices"][0]["text"]
    text = post(server, "/v1/completions", {"prompt": "word " * 300, "max_tokens": 2}).json()
    again = post(server, "/v1/completions", {"prompt": "word " * 300, "max_tokens": 2}).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        (text["usage"]["prompt_tokens"] - 1) // 16 * 16)


def test_chat_tokenize_and_cache_agree(server: ReplicaServer) -> None:
    messages = [{"role": "system", "content": "You are terse. " * 60},
                {"role": "user", "content": "Hello there"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    tok = post(server, "/tokenize", {"messages": messages, "tools": tools}).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 4096
    local = Tokenizer().encode(apply_chat_template(messages, tools))
    assert tok["tokens"] == local
    post(server, "/v1/chat/completions", {"messages": messages, "tools": tools, "max_tokens": 2})
    second = post(server, "/v1/chat/completions",
                  {"messages": messages, "tools": tools, "max_tokens": 2}).json()
    assert second["usage"]["prompt_tokens"] == tok["count"]
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == (
        (tok["count"] - 1) // 16 * 16)
    assert second["choices"][0]["message"]["role"] == "assistant"
    detok = post(server, "/detokenize", {"tokens": tok["tokens"][:5]}).json()
    assert detok["prompt"].startswith("<|begin_of_text|>")


def test_every_replica_decodes_what_another_encoded(server: ReplicaServer) -> None:
    """One model, one vocabulary: a token only replica 0 has seen (a timestamp's digits) is
    decoded by replica 1's /detokenize, as a real fleet's replicas decode any id of their
    model. (The exporter reads a culprit back over tokens the other replica stored.)"""
    sibling = ReplicaServer(Replica(EngineConfig(num_blocks=64), index=1), "127.0.0.1", 0)
    sibling.start()
    try:
        stamp = f"Current date and time: {time.time_ns()}"  # digits no replica saw before
        ids = post(server, "/tokenize", {"prompt": stamp}).json()["tokens"]
        text = post(sibling, "/detokenize", {"tokens": ids}).json()["prompt"]
        assert text.endswith(stamp) and "<" not in text.removeprefix("<|begin_of_text|>")
    finally:
        sibling.stop()


def test_lora_and_salt_over_http(server: ReplicaServer) -> None:
    prompt = list(range(5000, 5400))
    post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1})
    lora = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                            "model": "adapter-a"}).json()
    salted = post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 1,
                                              "cache_salt": "tenant-9"}).json()
    assert lora["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert salted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    unknown = post(server, "/v1/completions", {"prompt": prompt, "model": "nope"})
    assert unknown.status_code == 404


@pytest.mark.parametrize("path,body,raw,status", [
    ("/v1/completions", None, b"{not json", 400),
    ("/v1/completions", None, b"[1, 2]", 400),
    ("/v1/completions", {"max_tokens": 3}, None, 400),
    ("/v1/completions", {"prompt": ""}, None, 400),
    ("/v1/completions", {"prompt": [1, "a"]}, None, 400),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -1}, None, 400),
    ("/v1/completions", {"prompt": list(range(5000))}, None, 400),  # over max_model_len
    ("/v1/chat/completions", {"messages": []}, None, 400),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, None, 400),
    ("/tokenize", {}, None, 400),
    ("/nope", {}, None, 404),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": 5},
     None, 400),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "tools": 5}, None, 400),
    ("/v1/completions", None, b"[" * 100_000, 400),
    ("/v1/completions", None, b'{"prompt": ' + b"[" * 100_000, 400),
])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server: ReplicaServer, path, body,
                                                           raw, status) -> None:
    resp = post(server, path, body, raw)
    assert resp.status_code == status
    assert "message" in resp.json()["error"]
    ok = post(server, "/v1/completions", {"prompt": "still alive", "max_tokens": 1})
    assert ok.status_code == 200


def test_get_endpoints(server: ReplicaServer) -> None:
    base = f"http://127.0.0.1:{server.port}"
    assert requests.get(base + "/health", timeout=5).status_code == 200
    models = requests.get(base + "/v1/models", timeout=5).json()
    assert [m["id"] for m in models["data"]] == [EngineConfig().model, "adapter-a"]
    metrics = requests.get(base + "/metrics", timeout=5)
    assert metrics.headers["Content-Type"].startswith("text/plain")
    assert read_page(metrics.text).schema.schema == "vllm_v1"


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prefixwatch.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_cli_errors_exit_2() -> None:
    r = run_cli("simulate", "--scenario", "no-such-thing", "--duration", "1s")
    assert r.returncode == 2 and "unknown scenario" in r.stderr
    r = run_cli("simulate", "--switch-at", "1m", "--duration", "1s")
    assert r.returncode == 2 and "go together" in r.stderr
    r = run_cli("simulate", "--rate", "-3")
    assert r.returncode == 2
    r = run_cli("simulate", "--switch-at", "soon")
    assert r.returncode == 2


def test_cli_port_in_use_exits_2() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = run_cli("simulate", "--port", str(port), "--rate", "0", "--duration", "1s")
    assert r.returncode == 2 and "cannot listen" in r.stderr


def test_list_scenarios_explains_each() -> None:
    r = run_cli("simulate", "--list-scenarios")
    assert r.returncode == 0
    for name in SCENARIOS:
        assert name in r.stdout


def test_simulate_serves_and_drives_with_a_request_log(tmp_path) -> None:
    log = tmp_path / "requests.log"
    started = start_listening(
        [sys.executable, "-m", "prefixwatch.cli", "simulate", "--port", "0",
         "--rate", "20", "--duration", "20s", "--request-log", str(log), "--max-log-len", "64"],
        listening=re.compile(r"replica 0 .* on http://127\.0\.0\.1:(\d+)"))
    proc, port = started.proc, started.port
    try:
        deadline = time.monotonic() + 15
        hits = 0.0
        while time.monotonic() < deadline:
            try:
                page = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                values = next(iter(read_page(page).series.values()))
                hits = values.counters["hits"]
                if hits > 0:
                    break
            except (requests.ConnectionError, StopIteration):
                pass
            time.sleep(0.2)
        assert hits > 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    deadline = time.monotonic() + 5  # the log's last lines, read by start_listening's thread
    while "sent" not in "".join(started.log) and time.monotonic() < deadline:
        time.sleep(0.05)
    err = "".join(started.log)
    assert proc.returncode == 0, err
    assert "sent" in err
    lines = log.read_text().splitlines()
    details = [ln for ln in lines if " details: prompt: " in ln]
    assert details and details[0].startswith("DEBUG ")
    ids = details[0].split("prompt_token_ids: ")[1].split("]")[0]
    assert len(json.loads(ids + "]")) == 64


def test_a_short_body_with_a_long_content_length_gets_a_400(monkeypatch) -> None:
    """The read times out (shortened here) and the client still gets a JSON error."""
    import socket

    import prefixwatch.simulator.server as server_module

    monkeypatch.setattr(server_module, "REQUEST_TIMEOUT", 0.5)
    srv = ReplicaServer(Replica(EngineConfig(num_blocks=64, max_model_len=256)), "127.0.0.1", 0)
    srv.start()
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
                         b'{"prompt": "hi"')
            answer = b""
            while b"}}" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400")
        assert "Content-Length" in json.loads(body)["error"]["message"]
    finally:
        srv.stop()
