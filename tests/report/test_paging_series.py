"""The report, the alert and the exporter's status judge one ratio, read against a real
Prometheus with the generated rules (compressed 20x in time).

A vLLM 0.33 page whose counters grow at exact rates: first a host-tier rescue (the device pool
serves 10% of the prompt tokens, the CPU tier 80%: device ratio low, effective ratio high), then
a collapse (1% from the device, nothing from the host). The rates are exact, so every window of
every reader sees the same ratio: the report, the alert's value and `prefixwatch status` must
agree to 0.001.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import requests

from prefixwatch.core.vocab import families, rulenames
from prefixwatch.core.vocab.windows import parse_duration
from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
from prefixwatch.exporter.service import Exporter
from prefixwatch.exporter.status import collect_status
from prefixwatch.mixin import rules, stack
from prefixwatch.mixin.config import MixinConfig
from prefixwatch.report import Request, write_report
from tests.conftest import (
    FIXTURES,
    PageServer,
    require_binary,
    start_prometheus,
    stop_processes,
    wait_ready,
)

SCALE = 0.05
QUERIES_PER_S = 2000.0
RESCUE = {"device": 0.10, "host": 0.80}
COLLAPSE = {"device": 0.01, "host": 0.0}


class LinearPage:
    """The fixture page with its prefix-cache counters growing at ``shares`` of
    QUERIES_PER_S, re-rendered every 0.2 s (continuous across a change of shares)."""

    def __init__(self, server: PageServer) -> None:
        self.server = server
        self.template = (FIXTURES / "vllm_metrics_cpu_offload.txt").read_text()
        self.totals = {"queries": 1e6, "device": 4e5, "host": 1e5}
        self.shares = dict(RESCUE)
        self.last = time.monotonic()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.render()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def set(self, shares: dict[str, float]) -> None:
        with self.lock:
            self.advance()
            self.shares = dict(shares)

    def advance(self) -> None:
        now = time.monotonic()
        queries = QUERIES_PER_S * (now - self.last)
        self.last = now
        self.totals["queries"] += queries
        for tier, share in self.shares.items():
            self.totals[tier] += share * queries

    def render(self) -> None:
        t = self.totals
        values = {
            families.read("queries", families.VLLM_V1): t["queries"],
            families.read("prompt_tokens", families.VLLM_V1): t["queries"],
            families.read("hits", families.VLLM_V1): t["device"],
            families.read("ext_queries", families.VLLM_V1): t["queries"] - t["device"],
            families.read("ext_hits", families.VLLM_V1): t["host"],
            families.read("prompt_tokens_cached", families.VLLM_V1): t["device"] + t["host"],
        }
        page = self.template
        for name, value in values.items():
            page = re.sub(rf"^({re.escape(name)}\{{[^\n]*\}}) \S+$", rf"\g<1> {value!r}", page,
                          flags=re.M)
        for source in ("device", "host"):
            page = re.sub(rf'^(vllm:prompt_tokens_cached_by_source_total\{{[^\n]*source="'
                          rf'{source}"\}}) \S+$', rf"\g<1> {t[source]!r}", page, flags=re.M)
        self.server.serve(page)

    def run(self) -> None:
        while not self.stop.wait(0.2):
            with self.lock:
                self.advance()
                self.render()


def query(prom: str, expr: str) -> list[dict]:
    return requests.get(f"{prom}/api/v1/query", params={"query": expr},
                        timeout=5).json()["data"]["result"]


def firing(prom: str) -> dict[str, float]:
    alerts = requests.get(f"{prom}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return {a["labels"]["alertname"]: float(a["value"]) for a in alerts
            if a["state"] == "firing" and a["labels"].get("severity") == "critical"}


@pytest.fixture(scope="module")
def stack_up(tmp_path_factory: pytest.TempPathFactory):
    prometheus = require_binary("prometheus", "prometheus")
    work = tmp_path_factory.mktemp("paging")
    server = PageServer()
    page = LinearPage(server)
    exporter = Exporter(ExporterConfig(
        targets=name_targets([TargetConfig(server.url)]), interval=0.5,
        listen_address="127.0.0.1:0", windows=("1m",)))
    exporter.start()
    cfg = MixinConfig(time_scale=SCALE)
    (work / "prefixwatch.exporter.rules.yml").write_text(rules.render("exporter", cfg))
    procs = []
    try:
        started = start_prometheus(
            prometheus, work / "prometheus.yml",
            lambda self_address: stack.prometheus_config(
                f"127.0.0.1:{exporter.port}", None, [str(work / "*.rules.yml")],
                scrape_interval="1s", evaluation_interval="1s", self_address=self_address),
            f"--storage.tsdb.path={work / 'data'}")
        procs.append(started.proc)
        wait_ready(f"{started.url}/-/ready", started.proc)
        yield started.url, page, server, cfg, work
    finally:
        page.stop.set()
        exporter.stop()
        stop_processes(procs)
        server.close()


EVALUATION = 1.0  # seconds, Prometheus's scrape and evaluation interval here


def last_evaluation(prom: str) -> float:
    """When Prometheus last evaluated the alert group (Unix seconds; 0 before the first)."""
    groups = requests.get(f"{prom}/api/v1/rules", timeout=5).json()["data"]["groups"]
    times = [g.get("lastEvaluation", "") for g in groups if any(
        r.get("name") == rulenames.ALERT_LOW for r in g["rules"])]
    return max((_unix(t) for t in times if t and not t.startswith("0001")), default=0.0)


def _unix(rfc3339: str) -> float:
    """Prometheus's RFC 3339 times (nanoseconds) as Unix seconds."""
    from datetime import datetime

    return datetime.fromisoformat(re.sub(r"(\.\d{6})\d+", r"\1", rfc3339)).timestamp()


def _seconds(span: float) -> str:
    return f"{max(1, int(span) + 1)}s"


def report(prom: str, cfg: MixinConfig, out: Path, start: float, end: float):
    return write_report(prom, out, Request(start, end, cfg.hit_ratio_threshold,
                                           ratio_window=cfg.critical_short_window,
                                           time_scale=cfg.time_scale))


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.5)


@pytest.mark.integration
def test_host_rescue_then_collapse(stack_up) -> None:
    prom, page, server, cfg, work = stack_up
    started = time.time()
    long_window = rulenames.r_effective(rulenames.MODEL, cfg.critical_long_window)

    # The rescue: the device ratio alone would page, the effective one does not.
    wait_for(lambda: query(prom, f"{long_window} > 0.89"), 60, "the rescue's 5m ratio")
    # The ratio the report draws has the history its checks read: its last five points, and
    # later a "before" phase (healthy for two of its windows: one is left out before a drop).
    short_window = rulenames.r_effective(rulenames.MODEL, cfg.critical_short_window)
    history = int(2 * parse_duration(cfg.scaled(cfg.critical_short_window)) / EVALUATION) + 3
    wait_for(lambda: query(prom, f"count_over_time({short_window}[1m]) >= {history}"), 60,
             f"{history} evaluations of the page's ratio")
    # Both of the page's windows hold rescue traffic only. Two more evaluations of the alert,
    # then: it was never pending nor firing, at any evaluation since the start (a page needs
    # `for:` of pending first, so this is stricter than waiting for no firing).
    evaluated = last_evaluation(prom)
    wait_for(lambda: last_evaluation(prom) >= evaluated + 2 * EVALUATION, 30,
             "two more evaluations")
    assert rulenames.ALERT_LOW not in firing(prom)
    since = _seconds(time.time() - started + 1)
    assert query(prom, f'ALERTS{{alertname="{rulenames.ALERT_LOW}"}}[{since}]') == []
    rescued = report(prom, cfg, work / "rescue", started - 600, time.time())
    data = rescued.data
    assert data.crossings.first_drop is None and not data.alerts
    assert [v for _, v in data.fleet[-5:]] == pytest.approx([0.9] * 5, abs=0.001)
    assert [v for _, v in data.device[-5:]] == pytest.approx([0.1] * 5, abs=0.001)
    assert data.notes and "longer than the data" in data.notes[0]  # 10 minutes asked, clipped
    md = rescued.markdown.read_text()
    assert "firing" not in md and "no alert fired" in md
    assert "effective hit ratio" in md

    # The collapse: everyone says 1%.
    page.set(COLLAPSE)
    wait_for(lambda: rulenames.ALERT_LOW in firing(prom), 90, "the page")
    # Until the window the readers compare holds collapse traffic only (the alert's value,
    # the 2m ratio the report draws, at 1%), and the page has a few evaluations of history.
    fired = f'ALERTS{{alertname="{rulenames.ALERT_LOW}",alertstate="firing"}}'
    wait_for(lambda: firing(prom).get(rulenames.ALERT_LOW, 1) < 0.0105
             and query(prom, f"count_over_time({fired}[1m]) >= 3"), 60,
             "the page's ratio at the collapse")
    alert_value = firing(prom)[rulenames.ALERT_LOW]
    now = time.time()
    status = collect_status(ExporterConfig(targets=name_targets([TargetConfig(server.url)])), 1.0)
    collapsed = report(prom, cfg, work / "collapse", started, now).data
    assert collapsed.fleet[-1][1] == pytest.approx(0.01, abs=0.001)
    assert alert_value == pytest.approx(collapsed.fleet[-1][1], abs=0.001)
    assert status[0].effective_ratio == pytest.approx(collapsed.fleet[-1][1], abs=0.001)
    assert [a.name for a in collapsed.alerts] == [rulenames.ALERT_LOW]
    assert collapsed.crossings.first_drop is not None
    assert collapsed.phase("before") is not None and collapsed.extra_recomputed_tokens > 0
