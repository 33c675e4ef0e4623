"""The KV event recordings of vLLM 0.33, replayed through real ZMQ PUB sockets on loopback into
the exporter: block counts, residency, and why every computed token was computed."""

from __future__ import annotations

import time

import pytest
import yaml
import zmq

from prefixwatch.exporter.config import ConfigFlags, build_config
from prefixwatch.exporter.service import Exporter
from tests.conftest import PageServer
from tests.exporter.kvstreams import (
    Publisher,
    page_of,
    recording,
    requests_of,
    value,
    wait_for,
    zeroed,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BS = 16


def _truth(name: str, replica: str) -> dict[str, int]:
    """What the per-request truth implies for one replica: prompt and cached tokens, the tokens
    computed in whole blocks, and the tails no full block covers."""
    rows = [r for r in requests_of(name) if r["replica"] == replica]
    prompt = sum(len(r["prompt_token_ids"]) for r in rows)
    cached = sum(r["cached_tokens"] for r in rows)
    blocks = sum(len(r["prompt_token_ids"]) // BS - r["cached_tokens"] // BS for r in rows)
    return {"prompt": prompt, "cached": cached, "computed": blocks * BS,
            "tail": prompt - cached - blocks * BS, "requests": len(rows)}


def _request_ledger(name: str) -> dict[str, dict[str, int]]:
    """The request ledger (core/cache/requestledger.py) of the recording's requests, per replica:
    the same definitions, computed from the prompts instead of the stream."""
    from prefixwatch.core.cache.prefixindex import PrefixIndex
    from prefixwatch.core.cache.requestledger import Ledger

    index, ledger, out = PrefixIndex(BS), Ledger(BS), {}
    for r in requests_of(name):
        result = index.add(r["prompt_token_ids"])
        parts = ledger.account(index, r["prompt_token_ids"], None, result, result.divergence,
                               r["replica"], r["cached_tokens"])
        mine = out.setdefault(r["replica"], {"layout": 0, "routing": 0})
        mine["layout"] += parts.layout
        mine["routing"] += parts.routing
    return out


class Bench:
    """Exporter + one PageServer and one Publisher per replica."""

    def __init__(self, tmp_path, replicas: int, name: str) -> None:
        self.name = name
        self.ctx = zmq.Context()
        self.pages = [PageServer() for _ in range(replicas)]
        self.pubs = [Publisher(self.ctx) for _ in range(replicas)]
        for i, page in enumerate(self.pages):
            page.serve(zeroed(page_of(name, i)))
        cfg = tmp_path / "exporter.yaml"
        cfg.write_text(yaml.safe_dump({"targets": [
            {"url": p.url, "name": f"replica-{i}", "kv_events": pub.endpoint}
            for i, (p, pub) in enumerate(zip(self.pages, self.pubs, strict=True))]}))
        self.exp = Exporter(build_config(ConfigFlags(config_file=str(cfg), interval=0.2,
                                                     listen_address="127.0.0.1:0"), environ={}))
        self.exp.start()
        for i in range(replicas):
            wait_for(lambda i=i: value(self.exp.registry, "prefixwatch_kv_events_up",
                                       target=f"replica-{i}") == 1.0, what="subscribed")
        wait_for(lambda: all(v.up for v in self.exp.views()), what="polled")
        self.exp.poll_round()  # polled and sampled: the ledger's baseline

    def replay(self) -> None:
        """Each message once the one before it is in: the engines' messages were seconds
        apart, so the order across replicas is the recording's, as it was live."""
        sent: dict[int, int] = {}
        for msg in recording(self.name):
            replica = int(msg.topic.split(b"@")[1].split(b"-")[1])
            self.pubs[replica].send(msg.frames)
            n = sent[replica] = sent.get(replica, 0) + 1
            source = self.exp.kv.sources[f"replica-{replica}"]
            wait_for(lambda s=source, n=n: s.messages == n, what="the message ingested")
        for i, page in enumerate(self.pages):
            page.serve(page_of(self.name, i))
        polled = [v.last_polled for v in self.exp.views()]
        wait_for(lambda: all(v.last_polled != p and v.up
                             for v, p in zip(self.exp.views(), polled, strict=True)),
                 what="the final pages polled")
        self.exp.poll_round()  # the final pages beside the stream, sampled

    def v(self, name: str, **labels: str) -> float | None:
        return value(self.exp.registry, name, **labels)

    def close(self) -> None:
        self.exp.stop()
        for pub in self.pubs:
            pub.close()
        for page in self.pages:
            page.close()
        self.ctx.destroy(linger=0)


def _replayed(tmp_path, replicas: int, name: str):
    bench = Bench(tmp_path, replicas, name)
    try:
        bench.replay()
        yield bench
    finally:
        bench.close()


@pytest.fixture
def fleet(tmp_path):
    yield from _replayed(tmp_path, 2, "fleet")


@pytest.fixture
def offload(tmp_path):
    yield from _replayed(tmp_path, 1, "offload")


def test_fleet_blocks_per_replica_and_medium_equal_the_recording(fleet) -> None:
    expected = {"replica-0": (2400, 1702), "replica-1": (1266, 568)}
    for target, (stored, removed) in expected.items():
        assert fleet.v("prefixwatch_kv_blocks_total", target=target, medium="GPU",
                       op="stored") == stored
        assert fleet.v("prefixwatch_kv_blocks_total", target=target, medium="GPU",
                       op="removed") == removed
        assert fleet.v("prefixwatch_kv_resident_blocks", target=target,
                       medium="GPU") == stored - removed
        assert fleet.v("prefixwatch_kv_events_lost_total", target=target) == 0
        assert fleet.v("prefixwatch_kv_events_errors_total", target=target,
                       reason="malformed_payload") == 0
        assert fleet.v("prefixwatch_kv_block_lifetime_seconds_count", target=target,
                       medium="GPU") == removed


def test_fleet_computed_parts_follow_the_per_request_truth(fleet) -> None:
    def part(target: str, name: str) -> float:
        got = fleet.v("prefixwatch_kv_computed_tokens_total", target=target, model_name=MODEL,
                      part=name)
        assert got is not None
        return got

    reqs = requests_of("fleet")
    # Replica 1's first static request: replica 0 held the 150 blocks of the system prompt.
    assert part("replica-1", "routing") == 150 * BS
    # Replica 0's first static prompt after the pressure: it held those blocks and lost them.
    assert part("replica-0", "eviction") >= 150 * BS
    # The timestamp phase: about 149 blocks of layout per request (6 per replica).
    per_replica = sum(1 for r in reqs if r["phase"] == "timestamp-at-top"
                      and r["replica"] == "replica-0")
    for target in ("replica-0", "replica-1"):
        layout_blocks = part(target, "layout") / BS / per_replica
        assert 149 <= layout_blocks <= 150
        truth = _truth("fleet", target)
        computed = sum(part(target, p) for p in ("eviction", "routing", "layout", "novel"))
        assert computed == truth["computed"]
        # Two sources, one definition: the stream's layout and routing are the request
        # ledger's over the same prompts, to the token.
        logged = _request_ledger("fleet")[target]
        assert (part(target, "layout"), part(target, "routing")) == (logged["layout"],
                                                                     logged["routing"])


def test_offload_host_hit_is_loaded_not_computed(offload) -> None:
    t = "replica-0"
    assert offload.v("prefixwatch_kv_blocks_total", target=t, medium="CPU", op="stored") > 0
    assert offload.v("prefixwatch_kv_loaded_tokens_total", target=t, model_name=MODEL,
                     medium="CPU") == 2400
    truth = _truth("offload", t)
    computed = sum(offload.v("prefixwatch_kv_computed_tokens_total", target=t,
                             model_name=MODEL, part=p) for p in
                   ("eviction", "routing", "layout", "novel"))
    # Every stored device block is either loaded or computed; the host hit is in cached.
    stored = offload.v("prefixwatch_kv_blocks_total", target=t, medium="GPU", op="stored")
    assert computed + 2400 == stored * BS
    assert computed == truth["computed"]
    assert offload.v("prefixwatch_kv_computed_tokens_total", target=t, model_name=MODEL,
                     part="eviction") == 0
    assert offload.v("prefixwatch_kv_computed_tokens_total", target=t, model_name=MODEL,
                     part="layout") == _request_ledger("offload")[t]["layout"]
    for medium in ("GPU", "CPU"):
        assert offload.v("prefixwatch_kv_resident_blocks", target=t, medium=medium) == (
            offload.v("prefixwatch_kv_blocks_total", target=t, medium=medium, op="stored")
            - offload.v("prefixwatch_kv_blocks_total", target=t, medium=medium, op="removed"))


def _ledger(bench: Bench, target: str) -> dict[str, int]:
    span = bench.exp.kv_ledgers.span(target, None)
    assert span is not None
    return {"prompt": span.prompt, **span.shares}


@pytest.mark.parametrize("name,replicas", [("fleet", 2), ("offload", 1)])
def test_the_event_ledger_closes_to_the_token_per_replica(tmp_path, name, replicas) -> None:
    bench = Bench(tmp_path, replicas, name)
    try:
        bench.replay()
        for i in range(replicas):
            target = f"replica-{i}"
            ledger = _ledger(bench, target)
            truth = _truth(name, target)
            assert ledger["prompt"] == truth["prompt"]
            assert ledger["achieved"] == truth["cached"]
            assert ledger["tail"] == truth["tail"]
            assert ledger["unexplained"] == 0
            assert sum(v for k, v in ledger.items() if k != "prompt") == ledger["prompt"]
            print(name, target, ledger)
        # The exporter's ledger families are the event source's, summed per model.
        shares = {p: bench.v("prefixwatch_ledger_ratio", model_name=MODEL, window="1h",
                             part=p) for p in ("achieved", "eviction", "routing", "layout",
                                               "novel", "tail", "unexplained")}
        assert all(v is not None for v in shares.values())
        assert abs(sum(shares.values()) - 1.0) < 1e-9
        tokens = {p: bench.v("prefixwatch_ledger_tokens_total", model_name=MODEL, part=p)
                  for p in ("prompt", "novel", "layout", "routing", "eviction", "tail",
                            "pool_reach")}
        assert tokens["prompt"] == sum(_truth(name, f"replica-{i}")["prompt"]
                                       for i in range(replicas))
        assert tokens["tail"] == sum(_truth(name, f"replica-{i}")["tail"]
                                     for i in range(replicas))
        # The request ledger's identity holds for the event source's counters too.
        assert tokens["prompt"] == sum(tokens[p] for p in ("novel", "layout", "routing",
                                                           "eviction", "pool_reach"))
    finally:
        bench.close()


def test_the_diagnosis_reads_the_measured_parts(fleet) -> None:
    causes = fleet.exp.state.diagnosis.causes
    on = {t: [c for c, v in causes[(t, MODEL)].items() if v] for t in ("replica-0", "replica-1")}
    # The recording's misses: layout and novel (the timestamp phase, the pressure prompts)
    # dominate; evictions of reused content and the routed static prompt are measured parts.
    req = fleet.exp.state.requests[MODEL]
    assert req.ledger is not None and req.ledger_unmeasured == ()
    assert req.ledger.eviction == 2 * 150 * BS
    assert req.ledger.routing == 150 * BS
    assert "prefix_divergence" in on["replica-0"], on


def test_otlp_carries_the_same_kv_figures(fleet) -> None:
    from prefixwatch.exporter.otlp import OtlpBridge
    from tests.exporter.test_otlp import Receiver

    receiver = Receiver()
    bridge = OtlpBridge(fleet.exp.collector, receiver.endpoint)
    try:
        bridge.export()
        got = {}
        for req in receiver.requests:
            for rm in req.resource_metrics:
                target = {a.key: a.value.string_value for a in rm.resource.attributes
                          }.get("prefixwatch.target")
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name != "prefixwatch_kv_blocks":
                            continue
                        for p in m.sum.data_points:
                            labels = {a.key: a.value.string_value for a in p.attributes}
                            got[(target, labels["medium"], labels["op"])] = p.as_double
        assert got[("replica-0", "GPU", "stored")] == 2400
        assert got[("replica-1", "GPU", "removed")] == 568
    finally:
        bridge.shutdown()
        receiver.close()


def test_listen_mode_routes_engines_that_connect_out_by_topic(tmp_path) -> None:
    """llm-d's layout, the recording's own: the engines connect to one bound SUB socket and
    each publishes on ``kv@<pod>@<model>``; the pod names the target."""
    ctx = zmq.Context()
    pages = [PageServer(), PageServer()]
    for i, page in enumerate(pages):
        page.serve(page_of("fleet", i))
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(yaml.safe_dump({
        "kv_events_listen": "tcp://127.0.0.1:*",
        "targets": [{"url": p.url, "name": f"replica-{i}"} for i, p in enumerate(pages)]}))
    exp = Exporter(build_config(ConfigFlags(config_file=str(cfg), interval=0.2,
                                            listen_address="127.0.0.1:0"), environ={}))
    exp.start()
    pubs = []
    try:
        wait_for(lambda: exp.kv.listener is not None and exp.kv.listener.bound is not None,
                 what="bound")
        for _ in range(2):
            pub = ctx.socket(zmq.PUB)
            pub.setsockopt(zmq.LINGER, 0)
            pub.connect(exp.kv.listener.bound)
            pubs.append(pub)
        wait_for(lambda: exp.kv.listener.peers == 2, what="both engines connected")
        # Connected, but no message of its topic yet: not up.
        assert value(exp.registry, "prefixwatch_kv_events_up", target="replica-0") == 0.0
        time.sleep(0.3)  # a PUB that just connected drops what it sends before the handshake
        for sent, msg in enumerate(recording("fleet"), start=1):
            replica = int(msg.topic.split(b"@")[1].split(b"-")[1])
            pubs[replica].send_multipart(msg.frames)
            wait_for(lambda n=sent: sum(s.messages for s in exp.kv.sources.values()) == n,
                     what="the message ingested")
        pubs[0].send_multipart([b"kv@nobody@x", (0).to_bytes(8, "big"), b"\x90"])
        listen_label = f"listen:{exp.config.kv_events_listen}"
        wait_for(lambda: value(exp.registry, "prefixwatch_kv_events_errors_total",
                               target=listen_label, reason="unknown_topic") == 1,
                 what="an unknown topic counted")
        for target, stored in (("replica-0", 2400), ("replica-1", 1266)):
            assert value(exp.registry, "prefixwatch_kv_events_up", target=target) == 1.0
            assert value(exp.registry, "prefixwatch_kv_blocks_total", target=target,
                         medium="GPU", op="stored") == stored
        assert value(exp.registry, "prefixwatch_kv_computed_tokens_total", target="replica-1",
                     model_name=MODEL, part="routing") == 150 * BS
    finally:
        exp.stop()
        for pub in pubs:
            pub.close(linger=0)
        for page in pages:
            page.close()
        ctx.destroy(linger=0)


def test_the_landing_page_shows_the_event_ledger(fleet) -> None:
    html_page = fleet.exp.landing_page()
    assert "from the KV event streams" in html_page
    assert "KV event streams (docs/kv-events.md)" in html_page
    assert "GPU 2,400" in html_page  # replica 0's stored blocks
    assert "needs a KV event stream" not in html_page
    for part in ("eviction", "routing", "layout", "novel", "tail", "unexplained"):
        assert part in html_page


def test_status_prints_the_event_ledger_over_its_gap() -> None:
    import subprocess
    import sys

    ctx = zmq.Context()
    page = PageServer()
    page.serve(zeroed(page_of("offload", 0)))
    pub = Publisher(ctx)
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefixwatch.cli", "status", "--target", page.url,
         "--kv-events", pub.endpoint, "--gap", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        pub.wait_subscribed()
        time.sleep(0.5)  # the first poll (the ledger's baseline) follows the subscription
        for msg in recording("offload"):
            pub.send(msg.frames)
        time.sleep(0.5)
        page.serve(page_of("offload", 0))
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        pub.close()
        page.close()
        ctx.destroy(linger=0)
    assert "Traceback" not in err, err
    assert "Ledger from the KV event streams" in out, out + err
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()
            if line.startswith("    ") and len(line.split()) > 2}
    truth = _truth("offload", "replica-0")
    assert int(rows["prompt"]) == truth["prompt"]
    assert int(rows["tail"]) == truth["tail"]
    assert int(rows["unexplained"]) == 0


class TokenizingServer:
    """/metrics (the fleet page), /health and /detokenize on 127.0.0.1: the detokenizer reads
    every token as a time of day, so what varies at a divergence is a date/time."""

    def __init__(self) -> None:
        import json as _json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        page = page_of("fleet", 0).encode()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _send(self, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._send(page if self.path == "/metrics" else b"{}",
                           "text/plain; version=0.0.4")

            def do_POST(self) -> None:  # noqa: N802
                data = _json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = " ".join(f"{t % 24:02d}:{t % 60:02d}" for t in data["tokens"])
                self._send(_json.dumps({"prompt": text}).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_divergence_positions_and_kinds_from_the_targets_detokenize(tmp_path) -> None:
    ctx = zmq.Context()
    server = TokenizingServer()
    pub = Publisher(ctx)
    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(yaml.safe_dump({"targets": [{"url": server.url, "name": "replica-0",
                                                "kv_events": pub.endpoint}]}))
    exp = Exporter(build_config(ConfigFlags(config_file=str(cfg), interval=0.2,
                                            listen_address="127.0.0.1:0"), environ={}))
    exp.start()
    try:
        pub.wait_subscribed()
        wait_for(lambda: value(exp.registry, "prefixwatch_kv_events_up",
                               target="replica-0") == 1.0, what="subscribed")
        # Replica 0's messages up to its first two timestamp-at-top requests.
        mine = [m for m in recording("fleet") if b"replica-0" in m.topic][:9]
        for msg in mine:
            pub.send(msg.frames)
        source = exp.kv.sources["replica-0"]
        wait_for(lambda: source.messages == len(mine), what="ingested")
        wait_for(lambda: source.kinds.get("date/time", 0) >= 1, what="a date/time named")
        # The timestamp sits at tokens 8..11: the chain leaves the static prompt's at 8.
        assert value(exp.registry, "prefixwatch_kv_divergence_position_tokens_bucket",
                     target="replica-0", model_name=MODEL, le="16.0") >= 1
        assert value(exp.registry, "prefixwatch_kv_divergences_total", target="replica-0",
                     model_name=MODEL, kind="date/time") >= 1
    finally:
        exp.stop()
        pub.close()
        server.close()
        ctx.destroy(linger=0)


def test_the_exporters_own_page_carries_the_kv_families(fleet) -> None:
    """Over HTTP, in the text format Prometheus reads (and promtool's lint, when installed)."""
    import shutil
    import subprocess

    import requests
    from prometheus_client.parser import text_string_to_metric_families

    body = requests.get(f"http://127.0.0.1:{fleet.exp.port}/metrics", timeout=10).text
    families = {f.name: f for f in text_string_to_metric_families(body)}
    for name in ("prefixwatch_kv_events_up", "prefixwatch_kv_events",
                 "prefixwatch_kv_events_errors", "prefixwatch_kv_events_lost",
                 "prefixwatch_kv_blocks", "prefixwatch_kv_resident_blocks",
                 "prefixwatch_kv_block_lifetime_seconds", "prefixwatch_kv_computed_tokens",
                 "prefixwatch_kv_divergence_position_tokens", "prefixwatch_ledger_tokens",
                 "prefixwatch_ledger_ratio"):
        assert name in families, name
    promtool = shutil.which("promtool")
    if promtool:
        kv = "\n".join(line for line in body.splitlines() if "prefixwatch_kv_" in line) + "\n"
        lint = subprocess.run([promtool, "check", "metrics"], input=kv, text=True,
                              capture_output=True, timeout=30)
        assert lint.returncode == 0, lint.stdout + lint.stderr
