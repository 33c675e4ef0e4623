"""The family table (core/families.py) is the one place a re-exposed family is defined: the page
reader reads each row, the collector and OTLP write it, the mixin's sources name it."""

from __future__ import annotations

import time

import pytest

from prefixwatch.core import families, schemas
from prefixwatch.exporter.collector import PrefixwatchCollector
from prefixwatch.exporter.config import TargetConfig
from prefixwatch.exporter.monitor import TargetMonitor
from prefixwatch.exporter.otlp import OtlpBridge
from prefixwatch.exporter.pagereader import read_page
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
        assert mon.up, mon.last_error
        out.append(mon)
    return out


def test_every_row_is_read_from_a_page(monitors: list[TargetMonitor]) -> None:
    seen: set[str] = set()
    for mon in monitors:
        for state in mon.series.values():
            v = state.values
            seen |= set(v.counters) | set(v.gauges) | set(v.histograms)
    for row in families.FAMILIES:
        if row.extra != "tier" and row.reads:
            assert row.role in seen, row.role


def test_every_row_is_written_by_the_collector_and_otlp(monitors: list[TargetMonitor]) -> None:
    written = {f.name for f in PrefixwatchCollector(monitors, {"1m": 60.0}).collect()
               if f.samples}
    data = OtlpBridge(monitors, "http://127.0.0.1:9").metrics_data()
    sent = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics
            for m in sm.metrics}
    for row in families.FAMILIES:
        if row.reads:  # a family derived by prefixwatch itself is its own module's to test
            assert row.out.name in written, row.out.name
            assert row.out.name in sent, row.out.name


def test_otlp_sends_the_collectors_numbers(monitors: list[TargetMonitor]) -> None:
    """Every sample of a target on /metrics is in that target's OTLP resource, same value."""
    families_out = list(PrefixwatchCollector(monitors, {"1m": 60.0}).collect())
    data = OtlpBridge(monitors, "http://127.0.0.1:9").metrics_data()
    compared = 0
    for rm in data.resource_metrics:
        target = rm.resource.attributes["prefixwatch.target"]
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
