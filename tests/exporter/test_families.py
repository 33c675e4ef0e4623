"""The family table (core/vocab/families.py) is the one place a re-exposed family is defined: the
page reader reads each row, the collector and OTLP write it, the mixin's sources name it."""

from __future__ import annotations

import threading
import time

import pytest
import yaml

from prefixwatch.core.vocab import exposition, families, schemas
from prefixwatch.exporter.collector import PrefixwatchCollector
from prefixwatch.exporter.config import ConfigFlags, TargetConfig, build_config
from prefixwatch.exporter.kvsubscriber.kinds import KindNamer
from prefixwatch.exporter.monitor import TargetMonitor
from prefixwatch.exporter.otlp import OtlpBridge
from prefixwatch.exporter.pagereader import read_page
from prefixwatch.exporter.service import Exporter
from prefixwatch.mixin.sources import source
from tests.conftest import FIXTURES

#: vLLM's --kv-cache-metrics histogram, which the fixtures were recorded without.
IDLE = """# TYPE vllm:kv_block_idle_before_evict_seconds histogram
vllm:kv_block_idle_before_evict_seconds_bucket{engine="0",le="1.0",model_name="%s"} 2
vllm:kv_block_idle_before_evict_seconds_bucket{engine="0",le="+Inf",model_name="%s"} 3
vllm:kv_block_idle_before_evict_seconds_sum{engine="0",model_name="%s"} 4.5
vllm:kv_block_idle_before_evict_seconds_count{engine="0",model_name="%s"} 3
"""


def pages() -> list[str]:
    """Between them, every row of the table: vLLM 0.33 with its CPU tier, and SGLang (which
    has the engine-reported ratio)."""
    vllm = (FIXTURES / "vllm_metrics_cpu_offload.txt").read_text()
    model = next(iter(read_page(vllm).series))[0]
    return [vllm + IDLE % ((model,) * 4), (FIXTURES / "sglang_metrics_hicache.txt").read_text()]


@pytest.fixture
def monitors() -> list[TargetMonitor]:
    out = []
    for i, page in enumerate(pages()):
        mon = TargetMonitor(TargetConfig(f"http://127.0.0.1:{i + 1}/metrics", name=f"t{i}"),
                            {"1m": 60.0}, 5.0)
        now = time.time()
        mon.ingest(page, now - 5)
        mon.ingest(page, now)
        assert mon.view.up, mon.view.last_error
        out.append(mon)
    return out


def test_every_row_is_read_from_a_page(monitors: list[TargetMonitor]) -> None:
    seen: set[str] = set()
    for mon in monitors:
        for state in mon.view.series.values():
            v = state.values
            seen |= set(v.counters) | set(v.gauges) | set(v.histograms)
    for row in families.FAMILIES:
        if row.extra != "tier" and row.reads:
            assert row.role in seen, row.role


#: The KV event recordings' replicas: between them every KV family (a host tier in offload).
STREAMS = (("fleet", 0), ("fleet", 1), ("offload", 0))


@pytest.fixture
def kv_exporter(tmp_path) -> Exporter:
    """An exporter (not started: no socket, no thread) with a target per recorded replica (its
    pages and KV event stream ingested as the poll and stream threads would), and two with
    the pages of ``pages()``."""
    from tests.exporter.kvstreams import page_of, recording, zeroed

    cfg = tmp_path / "exporter.yaml"
    cfg.write_text(yaml.safe_dump({"targets": [
        {"url": f"http://127.0.0.1:{i + 1}/metrics", "name": f"{name}-{r}",
         "kv_events": f"tcp://127.0.0.1:{i + 1}"} for i, (name, r) in enumerate(STREAMS)] + [
        {"url": f"http://127.0.0.1:{i + 9}/metrics", "name": f"t{i}"} for i in range(2)]}))
    exp = Exporter(build_config(ConfigFlags(config_file=str(cfg), windows=["1m"]), environ={}))
    now = time.time()
    final = [*(page_of(*stream) for stream in STREAMS), *pages()]
    first = [*map(zeroed, final[:len(STREAMS)]), *final[len(STREAMS):]]
    for mon, page in zip(exp.monitors, first, strict=True):
        mon.ingest(page, now - 10)
        exp.kv_ledgers.after_poll(mon.view, None, now - 10)
    exp.tick()
    for name, r in STREAMS:
        for msg in recording(name):
            if msg.topic.split(b"@")[1] == f"replica-{r}".encode():
                exp.kv.sources[f"{name}-{r}"].ingest(msg.frames)
    KindNamer(exp.kv.sources, {}, threading.Event()).name_once()  # no tokenizer: "unknown"
    for mon, page in zip(exp.monitors, final, strict=True):
        before = exp.kv_ledgers.before_poll(mon.name)  # as Exporter._poll samples its ledger
        mon.ingest(page, now)
        exp.kv_ledgers.after_poll(mon.view, before, now)
        assert mon.view.up, mon.view.last_error
    exp.tick()
    return exp


def _sent(bridge: OtlpBridge) -> dict[str, int]:
    """Family -> data points OTLP sends, over every resource."""
    out: dict[str, int] = {}
    for rm in bridge.metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out[m.name] = out.get(m.name, 0) + len(m.data.data_points)
    return out


def test_every_row_is_written_by_the_collector_and_otlp(kv_exporter: Exporter) -> None:
    """OTLP sends the exporter's own collector: every family of the table (the KV rows too),
    the event ledger's and every other family with samples on /metrics, as many points."""
    samples: dict[str, int] = {}
    for fam in kv_exporter.collector.collect():
        points = {(s.name.removeprefix(fam.name) in ("_bucket", "_sum", "_count", "_created"),
                   tuple(sorted((k, v) for k, v in s.labels.items() if k != "le")))
                  for s in fam.samples if not s.name.endswith("_created")}
        if points:
            samples[fam.name] = len(points)
    sent = _sent(OtlpBridge(kv_exporter.collector, "http://127.0.0.1:9"))
    for row in families.FAMILIES:
        assert row.out.name in samples, row.out.name
    for metric in (exposition.OUT_LEDGER_TOKENS, exposition.OUT_LEDGER_RATIO):
        assert metric.name in samples, metric.name
    assert sent == samples


def test_otlp_sends_the_collectors_numbers(monitors: list[TargetMonitor]) -> None:
    """Every sample of a target on /metrics is in that target's OTLP resource, same value."""
    collector = PrefixwatchCollector(lambda: [m.view for m in monitors], {"1m": 60.0})
    families_out = list(collector.collect())
    data = OtlpBridge(collector, "http://127.0.0.1:9").metrics_data()
    compared = 0
    for rm in data.resource_metrics:
        target = rm.resource.attributes.get("prefixwatch.target")
        sent = {m.name: m for sm in rm.scope_metrics for m in sm.metrics}
        for fam in families_out:
            for s in fam.samples:
                if s.labels.get("target") != target or s.name != fam.name + "_total":
                    continue
                attrs = {k: v for k, v in s.labels.items() if k != "target"}
                points = [p.value for p in sent[fam.name].data.data_points
                          if dict(p.attributes) == attrs]
                assert points == [s.value], (fam.name, attrs)
                compared += 1
    assert compared > 20


def test_the_mixin_sources_name_every_row() -> None:
    exporter, vllm, sglang = source("exporter"), source("vllm"), source("sglang")
    for row in families.FAMILIES:
        assert getattr(exporter, row.role) == families.exposed(row.out)
        for src, schema in ((vllm, schemas.VLLM_V1), (sglang, schemas.SGLANG)):
            read = row.read_on(schema.schema)
            expected = None if read is None else read + (
                "_bucket" if row.kind == "histogram" else "")
            assert getattr(src, row.role) == expected, (src.name, row.role)


def test_the_page_reader_keeps_every_read_of_its_schema() -> None:
    for schema in schemas.SCHEMAS:
        wanted = schema.sample_names()
        for row in families.FAMILIES:
            read = row.read_on(schema.schema)
            if read is None or row.extra == "tier":
                continue
            probe = read + "_bucket" if row.kind == "histogram" else read
            assert probe in wanted, (schema.schema, row.role)
