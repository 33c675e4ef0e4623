"""OTLP/HTTP export through opentelemetry-sdk, decoded by a real receiver in the test."""

from __future__ import annotations

import gzip
import threading
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from prefixwatch.core.vocab import causes
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.otlp import OtlpBridge
from prefixwatch.exporter.service import Exporter
from tests.conftest import PageServer, with_counters

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


class Receiver:
    """An OTLP/HTTP metrics endpoint that decodes what it gets."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                msg = ExportMetricsServiceRequest()
                msg.ParseFromString(body)
                receiver.requests.append(msg)
                receiver.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_otlp_export_carries_counters_and_ratios(receiver: Receiver, page_server: PageServer,
                                                 vllm_page: str) -> None:
    cfg = ExporterConfig(targets=name_targets([TargetConfig(page_server.url)]),
                         listen_address="127.0.0.1:0", windows=("1m",),
                         otlp_endpoint=receiver.endpoint)
    exporter = Exporter(cfg)
    bridge = OtlpBridge(exporter.collector, receiver.endpoint, timeout=5)
    exporter.round_listeners.append(bridge.export)
    try:
        page_server.serve(with_counters(vllm_page, 1000, 800))
        exporter.poll_round()
        page_server.serve(with_counters(vllm_page, 2000, 830))
        exporter.poll_round()
    finally:
        bridge.shutdown()
    assert receiver.paths and all(p == "/v1/metrics" for p in receiver.paths)
    last = receiver.requests[-1]
    resource = {a.key: a.value.string_value for a in last.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "prefixwatch"
    assert resource["prefixwatch.target"] == exporter.monitors[0].name
    metrics = {m.name: m for sm in last.resource_metrics[0].scope_metrics for m in sm.metrics}
    hits = metrics["prefixwatch_prefix_cache_hits"]
    assert hits.sum.is_monotonic
    point = hits.sum.data_points[0]
    attrs = {a.key: a.value.string_value for a in point.attributes}
    assert attrs == {"model_name": MODEL, "engine": "0", "server": "vllm"}
    assert point.as_double == 830.0
    ratios = {
        tuple(sorted((a.key, a.value.string_value) for a in p.attributes)): p.as_double
        for p in metrics["prefixwatch_prefix_cache_hit_ratio"].gauge.data_points
    }
    series = (("model_name", MODEL), ("server", "vllm"))
    assert ratios[(*series, ("window", "1m"))] == pytest.approx(0.03)
    assert ratios[(*series, ("window", "lifetime"))] == pytest.approx(0.415)
    up = metrics["prefixwatch_target_up"].gauge.data_points[0].as_double
    assert up == 1.0
    diagnosis = {next(a.value.string_value for a in p.attributes if a.key == "cause"): p.as_double
                 for p in metrics["prefixwatch_diagnosis"].gauge.data_points}
    assert set(diagnosis) == set(causes.CAUSE_NAMES)


def test_otlp_failure_does_not_stop_polling(page_server: PageServer, vllm_page: str) -> None:
    from tests.conftest import refused_port

    cfg = ExporterConfig(targets=name_targets([TargetConfig(page_server.url)]),
                         listen_address="127.0.0.1:0", windows=("1m",))
    exporter = Exporter(cfg)
    with refused_port() as port:
        bridge = OtlpBridge(exporter.collector, f"http://127.0.0.1:{port}", timeout=1)
        exporter.round_listeners.append(bridge.export)
        page_server.serve(vllm_page)
        exporter.poll_round()
        exporter.poll_round()
        assert exporter.monitors[0].view.up and exporter.rounds == 2
        bridge.shutdown()


def test_otlp_sends_the_series_of_no_configured_target(tmp_path) -> None:
    """Listen mode's unrouted stream and the fleet's series have no target resource of their
    own: they are sent too (the stream under its label, the rest in the exporter's resource,
    last), as /metrics shows them."""
    import yaml

    from prefixwatch.exporter.config import ConfigFlags, build_config

    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(yaml.safe_dump({"targets": ["http://127.0.0.1:1/metrics"],
                                   "kv_events_listen": "tcp://127.0.0.1:*"}))
    exporter = Exporter(build_config(ConfigFlags(config_file=str(cfg)), environ={}))
    data = OtlpBridge(exporter.collector, "http://127.0.0.1:9").metrics_data()
    by_target = {rm.resource.attributes.get("prefixwatch.target"):
                 {m.name for sm in rm.scope_metrics for m in sm.metrics}
                 for rm in data.resource_metrics}
    assert "prefixwatch_kv_events_up" in by_target["listen:tcp://127.0.0.1:*"]
    assert "prefixwatch_build" in by_target[None]
    assert data.resource_metrics[-1].resource.attributes.get("prefixwatch.target") is None
