"""The KV event stream wired through the stack: docker-compose.yml (the simulator publishes,
the exporter's generated config subscribes to each replica), the Kubernetes manifests (vLLM's
--kv-events-config and the sidecar's --kv-events) and the endpoints agree."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from prefixwatch.mixin import stack

ROOT = Path(__file__).parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def flag(args: list[str], name: str) -> str:
    for i, arg in enumerate(args):
        if arg == name:
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise AssertionError(f"{name} not in {args}")


def test_compose_simulator_publishes_where_the_exporter_config_subscribes() -> None:
    sim = COMPOSE["services"]["simulator"]["command"]
    port, replicas = int(flag(sim, "--kv-events-port")), int(flag(sim, "--replicas"))
    http = int(flag(sim, "--port"))
    assert flag(sim, "--host") == "0.0.0.0"  # binds tcp://*:5557+i, as vllm serve does
    config = yaml.safe_load((ROOT / stack.COMPOSE_EXPORTER).read_text())
    assert config["targets"] == [
        {"url": f"http://simulator:{http + i}/metrics", "kv_events": f"tcp://simulator:{port + i}"}
        for i in range(replicas)]
    assert config["diagnosis"]["routing_gap"] == 0.2  # the mixin's, as the sidecar's config
    exporter = COMPOSE["services"]["exporter"]
    mounted = f"./{stack.COMPOSE_EXPORTER}:/etc/prefixwatch/compose.simulator.yml:ro"
    assert mounted in exporter["volumes"]


def test_compose_exporter_reads_the_config_only_without_vllm_targets(tmp_path: Path) -> None:
    """The entrypoint adds --config for the simulator's targets, and leaves VLLM_TARGETS (the
    one setting that matters) alone when it is set."""
    exporter = COMPOSE["services"]["exporter"]
    entrypoint = [a.replace("$$", "$") for a in exporter["entrypoint"]]
    script = entrypoint[2].replace("exec prefixwatch", "exec echo prefixwatch")
    assert entrypoint[:2] == ["/bin/sh", "-c"]

    def run(targets: str | None) -> str:
        env = {"PATH": "/usr/bin:/bin"} | ({"VLLM_TARGETS": targets} if targets else {})
        return subprocess.run(["/bin/sh", "-c", script, *entrypoint[3:], *exporter["command"]],
                              capture_output=True, text=True, env=env, timeout=10,
                              check=True).stdout.split()

    assert run(None)[-1] == "--config=/etc/prefixwatch/compose.simulator.yml"
    assert run(None)[:2] == ["prefixwatch", "exporter"]
    assert not any(a.startswith("--config") for a in run("http://vllm:8000/metrics"))


def test_kubernetes_vllm_publishes_where_the_sidecar_subscribes() -> None:
    docs = list(yaml.safe_load_all(stack.k8s_files()["vllm-with-prefixwatch.yaml"]))
    pod = next(d for d in docs if d and d["kind"] == "Deployment")["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    sidecar = next(c for c in pod["containers"] if c["name"] == "prefixwatch")
    config = json.loads(flag(vllm["args"], "--kv-events-config"))
    assert config["enable_kv_cache_events"] is True and config["publisher"] == "zmq"
    port = config["endpoint"].rsplit(":", 1)[1]
    assert config["endpoint"] == f"tcp://*:{port}"  # vLLM binds a wildcard endpoint
    assert flag(sidecar["args"], "--kv-events") == f"tcp://127.0.0.1:{port}"


def test_compose_vllm_profile_publishes_kv_events_too() -> None:
    command = COMPOSE["services"]["vllm"]["command"]
    config = json.loads(flag(command, "--kv-events-config"))
    assert config["endpoint"] == f"tcp://*:{stack.KV_EVENTS_PORT}"


def test_compose_exporter_config_is_read_by_the_exporter() -> None:
    """The generated config uses the exporter's own keys: read by its loader, each simulated
    replica is a target with its KV event endpoint."""
    from prefixwatch.exporter.config import ConfigFlags, build_config

    sim = COMPOSE["services"]["simulator"]["command"]
    port, http = int(flag(sim, "--kv-events-port")), int(flag(sim, "--port"))
    cfg = build_config(ConfigFlags(config_file=str(ROOT / stack.COMPOSE_EXPORTER)))
    assert [(t.url, t.kv_events) for t in cfg.targets] == [
        (f"http://simulator:{http + i}/metrics", f"tcp://simulator:{port + i}")
        for i in range(int(flag(sim, "--replicas")))]


def test_kubernetes_sidecar_args_are_the_exporters(tmp_path: Path) -> None:
    """The sidecar's args parse with `prefixwatch exporter`'s own parser and give one target
    subscribed to vLLM's stream (the mounted config is the generated ConfigMap's)."""
    from prefixwatch.cli import build_parser
    from prefixwatch.exporter.cli import config_from

    docs = [d for f in stack.k8s_files().values() for d in yaml.safe_load_all(f) if d]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "prefixwatch")
    config_map = next(d for d in docs if d["kind"] == "ConfigMap"
                      and "config.yml" in d.get("data", {}))
    mounted = tmp_path / "config.yml"
    mounted.write_text(config_map["data"]["config.yml"])
    args = [str(mounted) if a.endswith("/config.yml") else a for a in sidecar["args"]]
    cfg = config_from(build_parser().parse_args(args))
    assert [(t.url, t.kv_events) for t in cfg.targets] == [
        ("http://127.0.0.1:8000/metrics", flag(sidecar["args"], "--kv-events"))]
