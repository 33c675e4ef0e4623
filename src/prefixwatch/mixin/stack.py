"""The deployable stack's generated files: Prometheus config and Kubernetes manifests.

One function per file, parametrised by where things live, so docker-compose (service names),
the native demo (loopback ports) and Kubernetes (PrometheusRule, ConfigMaps) are all built from
the same rules and dashboards generators and the same MixinConfig, and cannot drift. The
sidecar mounts an exporter config holding the config's diagnosis settings (threshold, cold
start, ...), so the exporter diagnoses against the threshold the alerts page on. The committed
copies are part of ``artifacts.render_all``; a test fails when they differ.
"""

from __future__ import annotations

from typing import Any

import yaml

from prefixwatch.core import names, settings
from prefixwatch.core.version import __version__
from prefixwatch.mixin import dashboards, rules
from prefixwatch.mixin.config import MixinConfig

COMPOSE_PROMETHEUS = "prometheus/prometheus.yml"
K8S_DIR = "deploy/kubernetes"
IMAGE = f"ghcr.io/prefixwatch/prefixwatch:{__version__}"
VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
GENERATED = "# Generated from the mixin config (prefixwatch.mixin.artifacts)."
#: Where the sidecar finds its exporter config (a ConfigMap volume).
EXPORTER_CONFIG_DIR = "/etc/prefixwatch"
EXPORTER_CONFIG_NAME = "prefixwatch-exporter"


def prometheus_config(exporter: str, alertmanager: str | None, rule_files: list[str],
                      scrape_interval: str = "15s", evaluation_interval: str = "15s",
                      self_address: str = "localhost:9090") -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval,
                   "evaluation_interval": evaluation_interval},
        "rule_files": rule_files,
    }
    if alertmanager:
        cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    cfg["scrape_configs"] = [
        {"job_name": "prefixwatch", "static_configs": [{"targets": [exporter]}]},
        {"job_name": "prometheus", "static_configs": [{"targets": [self_address]}]},
    ]
    return cfg


def compose_prometheus_yml(cfg: MixinConfig | None = None) -> str:
    mixin = cfg or MixinConfig()
    prom = prometheus_config(f"exporter:{names.DEFAULT_PORT}", "alertmanager:9093",
                             ["/etc/prometheus/rules/*.rules.yml"],
                             evaluation_interval=mixin.evaluation_interval)
    return (f"{GENERATED}\n"
            "# Mounted by docker-compose.yml at /etc/prometheus/prometheus.yml, with\n"
            "# alerts/prefixwatch.exporter.rules.yml under /etc/prometheus/rules/.\n"
            "# `prefixwatch demo` runs the same config on loopback.\n"
            + yaml.safe_dump(prom, sort_keys=False))


# -- Kubernetes --------------------------------------------------------------------------------

def _dump_all(docs: list[dict[str, Any]], header: str, literal: bool = False) -> str:
    """YAML documents; ``literal`` writes multi-line strings (a mounted file) as blocks."""
    dump = rules.dump if literal else (
        lambda d: yaml.safe_dump(d, sort_keys=False, width=1000))
    return header + "".join("---\n" + dump(d) for d in docs)


def k8s_prometheus_rule(cfg: MixinConfig) -> dict[str, Any]:
    doc = rules.Builder("exporter", cfg).document()
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
            "metadata": {"name": "prefixwatch", "labels": {"app.kubernetes.io/name": "prefixwatch",
                                                           "release": "prometheus"}},
            "spec": doc}


def k8s_dashboards(cfg: MixinConfig) -> list[dict[str, Any]]:
    out = []
    for name, dash in dashboards.all_dashboards("exporter", cfg).items():
        out.append({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name.removesuffix(".json"),
                                 "labels": {"grafana_dashboard": "1",
                                            "app.kubernetes.io/name": "prefixwatch"},
                                 "annotations": {"grafana_folder": "prefixwatch"}},
                    "data": {name: dashboards.to_json(dash)}})
    return out


def exporter_config(cfg: MixinConfig) -> dict[str, Any]:
    """The exporter's --config file: the diagnosis settings this mixin config implies (the
    exporter reads the same keys, core/settings.py)."""
    return {settings.DIAGNOSIS_KEY: cfg.diagnosis.as_mapping()}


def k8s_exporter_config(cfg: MixinConfig) -> dict[str, Any]:
    text = ("# The exporter's diagnosis settings, from the mixin config (threshold, cold start):\n"
            "# the alerts and the diagnosis judge against the same numbers.\n"
            + yaml.safe_dump(exporter_config(cfg), sort_keys=False))
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": EXPORTER_CONFIG_NAME,
                         "labels": {"app.kubernetes.io/name": "prefixwatch"}},
            "data": {"config.yml": text}}


def k8s_workload(cfg: MixinConfig) -> list[dict[str, Any]]:
    labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/component": "inference"}
    sidecar = {
        "name": "prefixwatch",
        "image": IMAGE,
        "args": ["exporter", "--target", "http://127.0.0.1:8000/metrics",
                 "--listen-address", f"0.0.0.0:{names.DEFAULT_PORT}",
                 "--config", f"{EXPORTER_CONFIG_DIR}/config.yml"],
        "ports": [{"name": "prefixwatch", "containerPort": names.DEFAULT_PORT}],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "prefixwatch"}},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "prefixwatch"},
                          "periodSeconds": 20},
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                      "limits": {"cpu": "500m", "memory": "256Mi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "prefixwatch-config", "mountPath": EXPORTER_CONFIG_DIR,
                          "readOnly": True}],
    }
    vllm = {
        "name": "vllm",
        "image": VLLM_IMAGE,
        "args": ["--model", "Qwen/Qwen2.5-1.5B-Instruct", "--enable-prefix-caching",
                 "--port", "8000"],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"},
                           "periodSeconds": 10, "failureThreshold": 60},
        "resources": {"limits": {"nvidia.com/gpu": 1}},
        "volumeMounts": [{"name": "hf-cache", "mountPath": "/root/.cache/huggingface"}],
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "vllm", "labels": labels},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [vllm, sidecar],
                         "volumes": [{"name": "hf-cache", "emptyDir": {}},
                                     {"name": "prefixwatch-config",
                                      "configMap": {"name": EXPORTER_CONFIG_NAME}}]},
            },
        },
    }
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "vllm", "labels": labels},
               "spec": {"selector": labels,
                        "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}}
    pod_monitor = {
        "apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
        "metadata": {"name": "prefixwatch", "labels": {"release": "prometheus"}},
        "spec": {"selector": {"matchLabels": labels},
                 "podMetricsEndpoints": [{"port": "prefixwatch", "path": "/metrics",
                                          "interval": "15s"}]},
    }
    return [k8s_exporter_config(cfg), deployment, service, pod_monitor]


def kustomization() -> dict[str, Any]:
    return {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "labels": [{"pairs": {"app.kubernetes.io/part-of": "prefixwatch"}}],
            "resources": ["vllm-with-prefixwatch.yaml", "prometheusrule.yaml",
                          "grafana-dashboards.yaml"]}


def k8s_files(cfg: MixinConfig | None = None) -> dict[str, str]:
    cfg = cfg or MixinConfig()
    header = f"{GENERATED} Do not edit by hand.\n"
    return {
        "kustomization.yaml": header + yaml.safe_dump(kustomization(), sort_keys=False),
        "vllm-with-prefixwatch.yaml": _dump_all(k8s_workload(cfg), header, literal=True),
        "prometheusrule.yaml": _dump_all([k8s_prometheus_rule(cfg)], header),
        "grafana-dashboards.yaml": _dump_all(k8s_dashboards(cfg), header),
    }


def generated_files(cfg: MixinConfig | None = None) -> dict[str, str]:
    """{path relative to the repository: text} of the Prometheus config and the manifests."""
    files = {COMPOSE_PROMETHEUS: compose_prometheus_yml(cfg)}
    files.update({f"{K8S_DIR}/{name}": text for name, text in k8s_files(cfg).items()})
    return files
