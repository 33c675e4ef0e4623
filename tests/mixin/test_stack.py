"""The deployable stack: docker-compose checked without Docker, the native stack run for real,
and the Kubernetes manifests validated."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from prefixwatch.mixin import alertmanager, stack
from prefixwatch.mixin.config import MixinConfig
from tests.conftest import npm_packages, require_binary
from tests.e2e.demorun import demo_until_page

ROOT = Path(__file__).parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_generated_stack_files_match(tmp_path: Path) -> None:
    for rel, text in stack.generated_files().items():
        committed = ROOT / rel
        assert committed.exists() and committed.read_text() == text, (
            f"{rel} drifted: run prefixwatch generate")


def test_compose_validates_against_the_compose_spec() -> None:
    workdir = npm_packages("dclint", ("dclint@3.1.0",))
    schema = json.loads((workdir / "node_modules/dclint/schemas/compose.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [e.message for e in validator.iter_errors(COMPOSE)]
    assert not errors, errors[:5]
    assert list(validator.iter_errors({**COMPOSE, "servics": {}})), "the check is not vacuous"


def test_compose_services_are_complete() -> None:
    services = COMPOSE["services"]
    assert {"exporter", "prometheus", "alertmanager", "grafana", "simulator", "vllm"} <= set(
        services)
    for name, svc in services.items():
        image = svc.get("image", "")
        assert re.fullmatch(r"[\w./-]+:[\w.-]+", image) and not image.endswith(":latest"), (
            f"{name}: image {image!r} is not pinned")
        assert svc.get("restart") == "unless-stopped", name
        assert "healthcheck" in svc, name
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
        for volume in svc.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in COMPOSE["volumes"], f"{name}: undeclared volume {source}"
        if "build" in svc:
            assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).exists()
    assert services["vllm"]["profiles"] == ["gpu"]
    assert "--enable-prefix-caching" in services["vllm"]["command"]
    assert {"prometheus-data", "grafana-data"} <= set(COMPOSE["volumes"])
    exporter_env = services["exporter"]["environment"]["PREFIXWATCH_TARGETS"]
    assert exporter_env.startswith("${VLLM_TARGETS:-http://simulator:8000/metrics")
    text = (ROOT / "docker-compose.yml").read_text()
    assert "hooks.slack.com" not in text and "PASSWORD: ${" in text, "secrets come from .env"
    grafana_env = services["grafana"]["environment"]
    assert grafana_env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"].endswith(
        "prefixwatch-overview.json")


def test_dockerfile_is_slim_pinned_and_non_root() -> None:
    text = (ROOT / "exporter" / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", f) for f in froms)
    assert re.search(r"^USER 10001$", text, re.M)
    assert "HEALTHCHECK" in text


def test_prometheus_config_checks(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    cfg = yaml.safe_load((ROOT / "prometheus" / "prometheus.yml").read_text())
    # As mounted in compose: the rules directory holds the exporter rules.
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "prefixwatch.exporter.rules.yml").write_text(
        (ROOT / "alerts" / "prefixwatch.exporter.rules.yml").read_text())
    cfg["rule_files"] = [str(rules_dir / "*.rules.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    for path in (ROOT / "prometheus" / "prometheus.yml", tmp_path / "prometheus.yml"):
        r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    assert "prefixwatch.exporter.rules.yml" in r.stdout, "the rules were checked too"


def test_alertmanager_config_as_compose_renders_it(tmp_path: Path) -> None:
    """The compose entrypoint substitutes the webhook URLs with sed: the result is valid."""
    amtool = require_binary("amtool", "prometheus-alertmanager")
    command = COMPOSE["services"]["alertmanager"]["command"][0]
    text = (ROOT / "alerts" / "alertmanager.yml").read_text()
    for env, default in alertmanager.DEFAULT_URLS.items():
        assert f"s#{default}#$${{{env}:-{default}}}#" in command
        text = text.replace(default, f"https://hooks.example/{env.lower()}")
    (tmp_path / "am.yml").write_text(text)
    r = subprocess.run([amtool, "check-config", str(tmp_path / "am.yml")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def k8s_docs() -> list[dict]:
    docs = []
    for path in sorted((ROOT / stack.K8S_DIR).glob("*.yaml")):
        if path.name != "kustomization.yaml":
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def test_kubernetes_builtin_kinds_validate() -> None:
    builtin = [d for d in k8s_docs() if "monitoring.coreos.com" not in d["apiVersion"]]
    assert {d["kind"] for d in builtin} == {"Deployment", "Service", "ConfigMap"}
    for doc in builtin:
        kubernetes_validate.validate(doc, "1.30", strict=True)
    deployment = next(d for d in builtin if d["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.30", strict=True)
    containers = {c["name"] for c in deployment["spec"]["template"]["spec"]["containers"]}
    assert containers == {"vllm", "prefixwatch"}
    maps = [d for d in builtin if d["kind"] == "ConfigMap"
            and d["metadata"]["name"] != stack.EXPORTER_CONFIG_NAME]
    assert maps and all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
    for m in maps:
        for text in m["data"].values():
            assert json.loads(text)["uid"].startswith("prefixwatch-")


def test_the_sidecar_mounts_an_exporter_config_the_exporter_reads(tmp_path: Path) -> None:
    """The sidecar's --config holds the mixin's diagnosis settings, in keys the exporter's own
    config loader accepts: the diagnosis judges against the threshold the alerts page on."""
    from prefixwatch.exporter.config import ConfigFlags, build_config

    docs = k8s_docs()
    config_map = next(d for d in docs if d["metadata"]["name"] == stack.EXPORTER_CONFIG_NAME)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "prefixwatch")
    mount = sidecar["volumeMounts"][0]
    path = sidecar["args"][sidecar["args"].index("--config") + 1]
    assert path == f"{mount['mountPath']}/config.yml"
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == stack.EXPORTER_CONFIG_NAME
    (tmp_path / "config.yml").write_text(config_map["data"]["config.yml"])
    exporter = build_config(ConfigFlags(config_file=str(tmp_path / "config.yml")), environ={})
    expected = MixinConfig().diagnosis
    assert exporter.thresholds == expected.thresholds and exporter.cold_start == "10m"
    assert exporter.thresholds.hit_ratio == MixinConfig().hit_ratio_threshold


# The parts of the Prometheus Operator CRDs (monitoring.coreos.com/v1) that these use.
PROMETHEUS_RULE_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {"type": "object", "required": ["groups"], "additionalProperties": False,
                 "properties": {"groups": {"type": "array", "items": {
                     "type": "object", "required": ["name", "rules"],
                     "additionalProperties": False,
                     "properties": {"name": {"type": "string"}, "interval": {"type": "string"},
                                    "rules": {"type": "array", "items": {
                                        "type": "object", "required": ["expr"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "record": {"type": "string"},
                                            "alert": {"type": "string"},
                                            "expr": {"type": "string"},
                                            "for": {"type": "string"},
                                            "labels": {"type": "object"},
                                            "annotations": {"type": "object"}}}}}}}}},
    },
}
POD_MONITOR_SCHEMA = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "kind": {"const": "PodMonitor"},
        "spec": {"type": "object", "required": ["selector", "podMetricsEndpoints"],
                 "properties": {"podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                     "type": "object", "required": ["port"],
                     "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                    "interval": {"type": "string"}}}}}},
    },
}


def test_prometheus_operator_resources(tmp_path: Path) -> None:
    promtool = require_binary("promtool", "prometheus")
    docs = k8s_docs()
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    jsonschema.validate(rule, PROMETHEUS_RULE_SCHEMA)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    r = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    committed = yaml.safe_load((ROOT / "alerts" / "prefixwatch.exporter.rules.yml").read_text())
    assert rule["spec"] == committed, "the PrometheusRule holds the generated rules"
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    jsonschema.validate(monitor, POD_MONITOR_SCHEMA)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    ports = [p["name"] for c in deployment["spec"]["template"]["spec"]["containers"]
             for p in c.get("ports", [])]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] in ports
    kustomization = yaml.safe_load((ROOT / stack.K8S_DIR / "kustomization.yaml").read_text())
    for resource in kustomization["resources"]:
        assert (ROOT / stack.K8S_DIR / resource).exists()


@pytest.mark.integration
def test_native_stack_pages_on_a_simulated_regression(tmp_path: Path) -> None:
    """`prefixwatch demo` with the real binaries: the regression reaches the webhook as a page,
    and SIGTERM stops every process (the newcomer walk covers Ctrl-C and its report)."""
    run = demo_until_page(tmp_path)
    pages, out, err = run.pages, run.out, run.err
    assert pages, f"no page; demo exited {run.returncode}"
    assert pages[0]["labels"]["alertname"] == "PrefixCacheHitRateLow"
    assert pages[0]["labels"]["severity"] == "critical"
    assert run.returncode == 0, err[-2000:]
    assert "Prometheus:" in out and "Alertmanager:" in out and "Grafana: not started" in out
    assert "demo stopped" in err
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(tmp_path / "data") not in ps, "Prometheus or Alertmanager left running"
