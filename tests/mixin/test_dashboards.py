"""The dashboards: committed JSON matches the generator, validates against Grafana's schema,
every query parses, every name exists, and every panel shows data from a real Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import jsonschema
import pytest
import requests
import yaml

from prefixwatch.core.vocab import exposition, families, schemas
from prefixwatch.mixin import artifacts, dashboards, rules, sources
from prefixwatch.mixin import config as mixin_config
from tests.conftest import file_lock, npm_packages, require_binary, start_listening, wait_ready

ROOT = Path(__file__).parents[2]
SCHEMA_PACKAGES = ("@grafana/schema@13.2.3", "ts-json-schema-generator@2.4.0")


def all_json() -> dict[str, dict]:
    out = {}
    for source in dashboards.SOURCES:
        for name, dash in dashboards.all_dashboards(source).items():
            out[name] = json.loads(dashboards.to_json(dash))
    return out


def test_committed_dashboards_match_the_generator(tmp_path: Path) -> None:
    files = artifacts.under(artifacts.render_all(), "dashboards")
    assert set(files) == {f"prefixwatch-{kind}{suffix}.json" for kind in ("overview", "replica")
                          for suffix in ("", "-vllm", "-sglang")}
    for name, text in files.items():
        committed = ROOT / "dashboards" / name
        assert committed.exists() and committed.read_text() == text, (
            f"{committed} drifted: run prefixwatch dashboards")
    for path in dashboards.write(tmp_path):
        assert path.read_text() == files[path.name]
    again = dashboards.write(tmp_path / "again")
    assert [p.read_text() for p in again] == [
        (tmp_path / p.name).read_text() for p in again], "generation is deterministic"


def test_panels_are_laid_out_by_the_grid_with_auto_ids() -> None:
    """Ids 1..n in order; panels fill rows of 24 columns left to right, never overlapping."""
    from prefixwatch.mixin.config import load_config

    cluster = load_config(data={"cluster_label": "cluster"})
    for cfg in (mixin_config.MixinConfig(), cluster):
        for source in dashboards.SOURCES:
            for name, dash in dashboards.all_dashboards(source, cfg).items():
                panels = json.loads(dashboards.to_json(dash))["panels"]
                assert [p["id"] for p in panels] == list(range(1, len(panels) + 1)), name
                cells: set[tuple[int, int]] = set()
                previous = (-1, -1)
                for p in panels:
                    pos = p["gridPos"]
                    assert pos["x"] + pos["w"] <= 24, (name, p["title"])
                    assert (pos["y"], pos["x"]) > previous, (name, p["title"])
                    previous = (pos["y"], pos["x"])
                    mine = {(pos["x"] + i, pos["y"] + j) for i in range(pos["w"])
                            for j in range(pos["h"])}
                    assert not cells & mine, (name, p["title"], "overlaps")
                    cells |= mine
    with pytest.raises(ValueError):
        from prefixwatch.mixin import grid

        grid.flow([grid.Placed(object(), 25, 1)])


def test_sglang_dashboards_leave_out_what_sglang_lacks() -> None:
    overview = json.loads(dashboards.to_json(dashboards.overview("sglang")))
    titles = [p["title"] for p in overview["panels"]]
    assert "External (KV connector) cache" not in titles
    assert "Prompt length p50 vs p99" not in titles
    assert "KV-cache usage and waiting requests" in titles
    assert all("vllm:" not in expr for _, expr in dashboards.queries(overview))


def test_datasource_flag_preselects_it(tmp_path: Path) -> None:
    path = dashboards.write(tmp_path, datasource_uid="mimir-prod")[0]
    var = next(v for v in json.loads(path.read_text())["templating"]["list"]
               if v["name"] == "datasource")
    assert var["current"]["value"] == "mimir-prod"


def test_every_panel_is_described_and_linked() -> None:
    for name, dash in all_json().items():
        assert any(link.get("url", "").endswith("runbooks.md") for link in dash["links"]), name
        assert {v["name"] for v in dash["templating"]["list"]} == {
            "datasource", "job", "model", "instance"}
        ids = [p["id"] for p in dash["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dash["panels"]:
            assert len(panel.get("description", "")) > 40, (name, panel["title"])
            assert panel["datasource"]["uid"] == "${datasource}"
            for target in panel["targets"]:
                expr = target["expr"]
                if "rate(" in expr and ":rate" not in expr:
                    assert "[$__rate_interval]" in expr, (panel["title"], expr)


@pytest.fixture(scope="session")
def grafana_schema() -> dict:
    """Grafana's dashboard JSON Schema, generated from npm's @grafana/schema TypeScript types
    with ts-json-schema-generator (cached under ~/.cache/prefixwatch)."""
    workdir = npm_packages("grafana-schema", SCHEMA_PACKAGES)
    schema_path = workdir / "dashboard.schema.json"
    with file_lock(workdir / "schema.lock"):  # one worker writes it, the others wait
        if not schema_path.exists():
            types = "node_modules/@grafana/schema/dist/types/raw/dashboard/x/types.gen.d.ts"
            partial = workdir / "dashboard.schema.json.part"
            subprocess.run([str(workdir / "node_modules/.bin/ts-json-schema-generator"),
                            "--path", types, "--type", "Dashboard", "--no-type-check",
                            "-o", str(partial)], cwd=workdir, check=True, timeout=600)
            partial.replace(schema_path)
    return json.loads(schema_path.read_text())


def test_dashboards_validate_against_grafanas_schema(grafana_schema: dict) -> None:
    validator = jsonschema.Draft7Validator(grafana_schema)
    for name, dash in all_json().items():
        errors = [f"{list(e.path)}: {e.message[:200]}" for e in validator.iter_errors(dash)]
        assert not errors, (name, errors[:5])
    # The schema check is not vacuous: a legacy key is rejected.
    broken = {**all_json()["prefixwatch-overview.json"], "rows": []}
    assert list(validator.iter_errors(broken))


def fill_variables(expr: str, rate_interval: str = "5m", job: str = ".*", model: str = ".*",
                   instance: str = ".*") -> str:
    return (expr.replace("$__rate_interval", rate_interval).replace("$job", job)
            .replace("$model", model).replace("$instance", instance))


def test_every_query_parses(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    exprs = [fill_variables(expr) for dash in all_json().values()
             for _, expr in dashboards.queries(dash)]
    exprs += [fill_variables(v["query"].removeprefix("label_values(").rsplit(",", 1)[0])
              for dash in all_json().values() for v in dash["templating"]["list"]
              if v["type"] == "query"]
    doc = {"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:query_{i}:check", "expr": e} for i, e in enumerate(exprs)]}]}
    (tmp_path / "q.yml").write_text(yaml.safe_dump(doc, width=1000))
    result = subprocess.run([promtool, "check", "rules", str(tmp_path / "q.yml")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def known_names() -> set[str]:
    known = {"ALERTS", "up", "scrape_duration_seconds"}
    for metric in vars(exposition).values():
        if isinstance(metric, exposition.OutMetric):
            known |= {metric.name, metric.name + "_total", metric.name + "_bucket"}
    for schema in schemas.SCHEMAS:
        known |= set(schema.sample_names())
    for family in families.FAMILIES:
        known |= {n for read in family.reads.values() for n in (read, read + "_bucket")}
    for tier_schema in schemas.TIER_SCHEMAS.values():
        known |= set(tier_schema.sample_names())
    for source in sources.SOURCES:
        for rule in rules.Builder(source, mixin_config.MixinConfig()).recording():
            known.add(rule["record"])
    return known


def test_every_name_exists_in_the_catalog_or_the_rules() -> None:
    known = known_names()
    for name, dash in all_json().items():
        for title, expr in dashboards.queries(dash):
            stripped = re.sub(r'"[^"]*"', '""', expr)
            for metric in re.findall(r"([a-zA-Z_:][\w:]*)\{", stripped):
                assert metric in known, (name, title, metric)


class Prom:
    """A real Prometheus on loopback, from the stack's config with addresses adjusted."""

    def __init__(self, tmp: Path, jobs: dict[str, str], rule_text: str) -> None:
        binary = require_binary("prometheus", "prometheus")
        (tmp / "rules").mkdir(parents=True)
        (tmp / "rules" / "prefixwatch.rules.yml").write_text(rule_text)
        cfg = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
        cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        cfg["rule_files"] = [str(tmp / "rules" / "*.rules.yml")]
        cfg.pop("alerting")
        cfg["scrape_configs"] = [{"job_name": job, "static_configs": [{"targets": [addr]}]}
                                 for job, addr in jobs.items()]
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg))
        started = start_listening(
            [binary, f"--config.file={tmp / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp / 'data'}", "--web.listen-address=127.0.0.1:0"])
        self.proc, self.port = started.proc, started.port

    def query(self, expr: str) -> list:
        r = requests.get(f"http://127.0.0.1:{self.port}/api/v1/query", params={"query": expr},
                         timeout=10)
        body = r.json()
        assert body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def wait_ready(self) -> None:
        wait_ready(f"http://127.0.0.1:{self.port}/-/ready", self.proc)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.mark.integration
@pytest.mark.slow
def test_every_panel_shows_data_from_a_real_prometheus(tmp_path: Path) -> None:
    from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
    from prefixwatch.exporter.requestlog.reader import RequestsLogConfig
    from prefixwatch.exporter.service import Exporter
    from prefixwatch.simulator.driver import Driver
    from prefixwatch.simulator.engine import EngineConfig
    from prefixwatch.simulator.kvpublisher import KVEventsOptions
    from prefixwatch.simulator.requestlog import RequestLogger
    from prefixwatch.simulator.scenarios import SCENARIOS
    from prefixwatch.simulator.server import Replica, ReplicaServer

    cfg = EngineConfig(prefill_tokens_per_s=2e5, time_per_output_token=0.002)
    log_path = tmp_path / "requests.log"
    log_stream = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    request_log = RequestLogger(log_stream)  # one logger: one lock around the shared file
    # The vLLM replicas publish their KV event streams; the exporter subscribes to each (the
    # "Why these tokens were computed" panel).
    sims = [ReplicaServer(Replica(cfg, index=i, request_log=request_log,
                                  kv_events=KVEventsOptions("tcp://127.0.0.1:0")),
                          "127.0.0.1", 0)
            for i in range(2)]
    sglang = [ReplicaServer(Replica(cfg, index=i, server="sglang"), "127.0.0.1", 0)
              for i in range(2)]
    for s in sims + sglang:
        s.start()
    exporter = Exporter(ExporterConfig(
        targets=name_targets([TargetConfig(f"http://127.0.0.1:{s.port}/metrics",
                                           kv_events=s.replica.kv_publisher.endpoint)
                              for s in sims]),
        interval=0.5, listen_address="127.0.0.1:0", windows=("1m",), diagnosis_window="15s",
        requests_log=RequestsLogConfig(str(log_path), follow=True)))
    exporter.start()
    driver = Driver([s.replica for s in sims], SCENARIOS["static-system-prompt"], 20, seed=4)
    sglang_driver = Driver([s.replica for s in sglang], SCENARIOS["static-system-prompt"], 20,
                           seed=5)
    scaled = mixin_config.MixinConfig(time_scale=0.05)
    proms = {
        "exporter": Prom(tmp_path / "p1", {"prefixwatch": f"127.0.0.1:{exporter.port}"},
                         rules.render("exporter", scaled)),
        "vllm": Prom(tmp_path / "p2", {f"vllm-{i}": f"127.0.0.1:{s.port}"
                                       for i, s in enumerate(sims)},
                     rules.render("vllm", scaled)),
        "sglang": Prom(tmp_path / "p3", {f"sglang-{i}": f"127.0.0.1:{s.port}"
                                         for i, s in enumerate(sglang)},
                       rules.render("sglang", scaled)),
    }
    replicas = {"exporter": exporter.monitors[0].name, "vllm": f"127.0.0.1:{sims[0].port}",
                "sglang": f"127.0.0.1:{sglang[0].port}"}
    try:
        driver.start()
        sglang_driver.start()
        for prom in proms.values():
            prom.wait_ready()

        def empty_panels() -> list[tuple[str, str, str]]:
            """Every variable without values and every panel without data, right now."""
            empty = []
            for source, prom in proms.items():
                replica_value = replicas[source]
                for name, dash in dashboards.all_dashboards(source).items():
                    data = json.loads(dashboards.to_json(dash))
                    one = "replica" in name
                    for var in data["templating"]["list"]:
                        if var["type"] == "query" and not prom.query(fill_variables(
                                var["query"].removeprefix("label_values(").rsplit(",", 1)[0])):
                            empty.append((source, name, f"variable {var['name']}"))
                    for panel in data["panels"]:
                        results = [prom.query(fill_variables(
                            t["expr"], rate_interval="4s",
                            instance=replica_value if one else ".*"))
                            for t in panel["targets"]]
                        if not any(results):
                            empty.append((source, name, panel["title"]))
            return empty

        # Until every panel shows data (the slowest need a few rule evaluations over 4 s
        # rates); a panel that never does fails at the deadline, named.
        deadline = time.monotonic() + 90
        while (empty := empty_panels()) and time.monotonic() < deadline:
            time.sleep(1)
        assert not empty, f"panels with no data: {empty}"
    finally:
        driver.stop()
        sglang_driver.stop()
        for prom in proms.values():
            prom.stop()
        exporter.stop()
        for s in sims + sglang:
            s.stop()
        log_stream.close()
