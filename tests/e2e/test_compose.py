"""`docker compose up`, the README's first command, run for real on a Docker engine.

The committed docker-compose.yml comes up on Debian's docker.io with docker-compose 1.29, on
local stand-ins of the pinned upstream images (tests/e2e/docker_standins.py: no registry is
reachable here) and prefixwatch's own image built from exporter/Dockerfile. Checked: every
service it starts is healthy with zero restarts; the exporter sees both simulated replicas
up; Prometheus has the rules loaded and scrapes the exporter; Alertmanager holds a firing
critical PrefixCacheHitRateLow within two minutes of the simulator's regression
(PREFIXWATCH_SWITCH_AT=1m); the exporter and the simulator stop on SIGTERM within 2 s, as
PID 1; `docker-compose down -v` leaves no container, volume or network behind.

Grafana has no Debian package, so no stand-in: the test leaves the grafana service out (and
prints so); the gpu profile (vLLM on a GPU) is checked by `docker-compose config` only.
A failure message carries each container's state and last log lines.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import free_port, require_binary
from tests.e2e.compose_stack import Compose, compose_copy
from tests.e2e.docker_standins import StandinBuilder, StandinUnavailable, read_pins

ROOT = Path(__file__).parents[2]
LEFT_OUT = {"grafana": "Grafana has no Debian package, so it has no local stand-in image",
            "vllm": "the gpu profile needs an NVIDIA GPU (checked by `config` only)"}
SWITCH_AT = 60.0  # PREFIXWATCH_SWITCH_AT, seconds after the simulator starts
HEALTHY_WITHIN = 120.0
#: Seconds from the regression to a firing critical page in Alertmanager: the rules page a
#: collapse within 75 s of the first sample that shows it, which comes within one exporter
#: poll (5 s) and one scrape (15 s) of the regression, plus up to one evaluation interval for
#: the evaluation's phase: about 65-90 s, at most 110 s.
PAGE_WITHIN = 120.0
STOP_WITHIN = 2.0
ALERT = "PrefixCacheHitRateLow"
# prefixwatch's log format; anything else on a container's output (a library's warning at
# start, a traceback) is a finding.
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                      r"prefixwatch[\w.]*: ")

pytestmark = [pytest.mark.integration, pytest.mark.docker]


def cache_dir() -> Path:
    base = os.environ.get("PREFIXWATCH_CACHE", Path.home() / ".cache" / "prefixwatch")
    return Path(base) / "docker-standins"


def require_engine() -> tuple[str, str]:
    """docker and docker-compose, with a daemon that answers; CI fails without them."""
    docker = require_binary("docker", "docker.io")
    compose = require_binary("docker-compose", "docker-compose")
    proc = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        unavailable(f"no Docker engine answers ({proc.stderr.strip()[:200]}): start dockerd "
                    "(`.ci/run` does)")
    return docker, compose


def unavailable(message: str) -> None:
    """Like a missing binary: a failure in CI, elsewhere a skip with a loud warning."""
    if os.environ.get("PREFIXWATCH_REQUIRE_BINARIES") == "1":
        pytest.fail(message)
    warnings.warn(message, stacklevel=3)
    pytest.skip(message)


def ensure_standins(docker: str, say: Callable[[str], None]) -> dict[str, str]:
    try:
        return StandinBuilder(docker, cache_dir(), say).ensure(read_pins(ROOT))
    except StandinUnavailable as exc:
        unavailable(str(exc))
        raise


@pytest.fixture
def say(capsys: pytest.CaptureFixture[str]) -> Callable[[str], None]:
    """Progress lines on the terminal, even under pytest's capture."""
    def emit(line: str) -> None:
        with capsys.disabled():
            print(f"[compose e2e] {line}", flush=True)
    return emit


@pytest.fixture
def stack(tmp_path: Path, say: Callable[[str], None]) -> Iterator[Compose]:
    docker, compose = require_engine()
    started = time.monotonic()
    how = ensure_standins(docker, say)
    say(f"stand-in images in {time.monotonic() - started:.1f}s: "
        + ", ".join(f"{tag} {state}" for tag, state in how.items()))
    project = f"pwe2e{os.getpid()}"
    runner = Compose(compose, docker, ROOT, tmp_path, project,
                     {"PREFIXWATCH_SWITCH_AT": f"{SWITCH_AT:g}s"})
    try:
        yield runner
    finally:
        runner.down()


def get_json(url: str, **params: str) -> dict:
    response = requests.get(url, params=params, timeout=5)
    response.raise_for_status()
    return response.json()


def wait_for(what: str, check: Callable[[], object], timeout: float, stack: Compose,
             every: float = 2.0) -> object:
    """check() until it returns something true; its last error goes in the message."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
            last = value
        except (requests.RequestException, ValueError, KeyError) as exc:
            last = exc
        time.sleep(every)
    raise AssertionError(f"{what}: not within {timeout:g}s (last: {last!r}){stack.report()}")


def targets_up(port: int) -> dict[str, float]:
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^prefixwatch_target_up\{[^}]*target="([^"]+)"[^}]*\} (\S+)$', text, re.M)}


def kv_events_up(port: int) -> dict[str, float]:
    """prefixwatch_kv_events_up per target: 1 while the exporter decodes that replica's stream."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^prefixwatch_kv_events_up\{[^}]*target="([^"]+)"[^}]*\} (\S+)$', text, re.M)}


def committed_rule_count() -> int:
    doc = yaml.safe_load((ROOT / "alerts" / "prefixwatch.exporter.rules.yml").read_text())
    return sum(len(group["rules"]) for group in doc["groups"])


def docker_time(stamp: str) -> float:
    """A Docker timestamp (RFC 3339, nanoseconds, UTC) as seconds since the epoch."""
    whole, _, frac = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(whole + "+00:00").timestamp() + float(f"0.{frac or 0}")


def started_at(stack: Compose, service: str) -> float:
    return docker_time(stack.inspect(service)["State"]["StartedAt"])


def firing_critical(port: int) -> list[dict]:
    alerts = requests.get(f"http://127.0.0.1:{port}/api/v2/alerts",
                          params={"active": "true", "silenced": "false",
                                  "filter": [f'alertname="{ALERT}"', 'severity="critical"']},
                          timeout=5).json()
    return [a for a in alerts if a["status"]["state"] == "active"]


def stop_gracefully(stack: Compose, service: str) -> tuple[float, float]:
    """`docker stop` with a 2 s grace: SIGTERM to PID 1, SIGKILL (exit 137) after it. Returns
    how long the process took to exit after the signal was asked for (the container's
    FinishedAt) and how long `docker stop` took as a whole (with the engine's teardown)."""
    cid = stack.container(service)
    asked, start = time.time(), time.monotonic()
    subprocess.run([stack.docker, "stop", "-t", f"{STOP_WITHIN:g}", cid], check=True,
                   capture_output=True, timeout=30)
    whole = time.monotonic() - start
    state = stack.inspect(service)["State"]
    exited = docker_time(state["FinishedAt"]) - asked
    assert state["ExitCode"] not in (137, -1) and exited < STOP_WITHIN, (
        f"{service} did not stop on SIGTERM within {STOP_WITHIN:g}s (exit "
        f"{state['ExitCode']}, {exited:.2f}s after the signal){stack.report()}")
    return exited, whole


def test_compose_up_pages_and_comes_down_clean(stack: Compose, say: Callable[[str], None]
                                               ) -> None:
    services = stack.run("config", "--services").stdout.split()
    stack.services = [s for s in services if s not in LEFT_OUT]
    for service, why in LEFT_OUT.items():
        say(f"left out: {service} ({why})")
    assert {"simulator", "exporter", "prometheus", "alertmanager"} <= set(stack.services)

    started = time.monotonic()
    stack.run("build", *[s for s in stack.services if s in ("simulator", "exporter")],
              timeout=900)
    say(f"prefixwatch image built from exporter/Dockerfile in {time.monotonic() - started:.1f}s")

    up = time.monotonic()
    stack.run("up", "-d", *stack.services, timeout=180)
    healthy = stack.wait_healthy(HEALTHY_WITHIN)
    say(f"all of {', '.join(stack.services)} healthy {healthy:.1f}s after `up`, 0 restarts")

    up_targets = wait_for("the exporter sees both simulated replicas up",
                          lambda: (t := targets_up(stack.ports["exporter"])) and len(
                              [v for v in t.values() if v == 1]) == 2 and t,
                          60, stack)
    say(f"exporter: targets up {sorted(up_targets)}")
    streams = wait_for("the exporter decodes both replicas' KV event streams",
                       lambda: (k := kv_events_up(stack.ports["exporter"])) and len(
                           [v for v in k.values() if v == 1]) == 2 and k, 60, stack)
    say(f"exporter: KV event streams up {sorted(streams)}")

    prom = f"http://127.0.0.1:{stack.ports['prometheus']}"
    expected = committed_rule_count()
    loaded = wait_for(
        "Prometheus has the rules loaded",
        lambda: (n := sum(len(g["rules"]) for g in get_json(
            f"{prom}/api/v1/rules")["data"]["groups"])) == expected and n, 60, stack)
    scraped = wait_for(
        "Prometheus scrapes the exporter",
        lambda: [t for t in get_json(f"{prom}/api/v1/targets")["data"]["activeTargets"]
                 if t["labels"]["job"] == "prefixwatch" and t["health"] == "up"], 60, stack)
    say(f"prometheus: {loaded} rules loaded, exporter scraped ({scraped[0]['scrapeUrl']})")

    regression = started_at(stack, "simulator") + SWITCH_AT
    am_port = stack.ports["alertmanager"]
    remaining = regression - time.time() + PAGE_WITHIN
    alerts = wait_for(f"Alertmanager holds a firing critical {ALERT}",
                      lambda: firing_critical(am_port), remaining, stack, every=5)
    paged = time.time()
    say(f"page: {ALERT} critical firing in Alertmanager {time.monotonic() - up:.0f}s after "
        f"`up`, {paged - regression:.0f}s after the regression; summary: "
        f"{alerts[0]['annotations']['summary']}")

    for service in stack.services:
        status, health, restarts = stack.state(service)
        assert (status, health, restarts) == ("running", "healthy", 0), (
            f"{service}: {status}, {health}, {restarts} restarts{stack.report()}")
    for service in ("simulator", "exporter"):
        lines = stack.logs(service, lines=500).splitlines()
        stray = [line for line in lines if not LOG_LINE.match(line)]
        errors = [line for line in lines if " ERROR " in line or " CRITICAL " in line]
        assert not stray and not errors, (
            f"{service} printed something besides its own log lines (a library warning, a "
            f"traceback) or logged an error: {(stray + errors)[:5]}{stack.report()}")

    probe = subprocess.run([stack.docker, "exec", stack.container("exporter"), "python", "-c",
                            "import matplotlib.pyplot"], capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode == 0 and not probe.stderr, (
        f"matplotlib (for `prefixwatch report`) in the exporter's container: "
        f"{probe.stderr.strip()}")

    for service in ("exporter", "simulator"):
        exited, whole = stop_gracefully(stack, service)
        say(f"{service} exited {exited:.2f}s after SIGTERM (`docker stop` {whole:.2f}s)")

    stack.down()
    left = stack.leftovers()
    assert not left, f"`docker-compose down -v` left {left} behind"
    say("down -v: no container, volume or network left")


def test_gpu_profile_config(tmp_path: Path) -> None:
    """The gpu profile adds vLLM, pinned, with the exporter pointed at it by VLLM_TARGETS."""
    compose = require_binary("docker-compose", "docker-compose")
    copy, _ = compose_copy(ROOT, tmp_path / "docker-compose.yml")
    (tmp_path / "empty.env").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["VLLM_TARGETS"] = "http://vllm:8000/metrics"
    base = [compose, "--env-file", str(tmp_path / "empty.env"), "--project-directory",
            str(ROOT), "-f", str(copy), "-p", "pwconfig"]
    gpu = subprocess.run([*base, "--profile", "gpu", "config"], capture_output=True, text=True,
                         timeout=60, env=env)
    assert gpu.returncode == 0, gpu.stderr
    resolved = yaml.safe_load(gpu.stdout)["services"]
    assert resolved["vllm"]["profiles"] == ["gpu"], "vLLM starts only with --profile gpu"
    assert re.fullmatch(r"vllm/vllm-openai:v[\d.]+", resolved["vllm"]["image"])
    assert resolved["vllm"]["deploy"]["resources"]["reservations"]["devices"][0][
        "capabilities"] == ["gpu"]
    assert resolved["exporter"]["environment"]["PREFIXWATCH_TARGETS"] == (
        "http://vllm:8000/metrics")


def test_kubernetes_sidecar_runs_on_a_read_only_root(tmp_path: Path, say: Callable[[str], None]
                                                     ) -> None:
    """The generated sidecar container, as Kubernetes runs it (read-only root filesystem, its
    uid, no capabilities, its emptyDir and ConfigMap mounts), on the image exporter/Dockerfile
    builds: it serves /healthz, logs nothing but its own lines, its HOME, /tmp and log
    directory are writable (matplotlib loads without a warning), and SIGTERM stops it."""
    docker, _ = require_engine()
    ensure_standins(docker, say)
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    tag = compose["services"]["exporter"]["image"]
    subprocess.run([docker, "build", "-q", "-f", str(ROOT / "exporter" / "Dockerfile"), "-t", tag,
                    str(ROOT)], check=True, capture_output=True, timeout=900)
    docs = [d for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
            for d in yaml.safe_load_all(path.read_text()) if d]
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    sidecar = next(c for c in pod["containers"] if c["name"] == "prefixwatch")
    volumes = {v["name"]: v for v in pod["volumes"]}
    security = sidecar["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    args = ["--read-only", "--user", str(security["runAsUser"]), "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges"]
    for mount in sidecar["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "emptyDir" in volume:  # as the kubelet makes one: an empty host directory, 0777
            source = tmp_path / mount["name"]
            source.mkdir()
            source.chmod(0o777)
            args += ["-v", f"{source}:{mount['mountPath']}"]
        else:
            config_map = next(d for d in docs if d["kind"] == "ConfigMap"
                              and d["metadata"]["name"] == volume["configMap"]["name"])
            source = tmp_path / mount["name"]
            source.mkdir()
            for key, text in config_map["data"].items():
                (source / key).write_text(text)
            args += ["-v", f"{source}:{mount['mountPath']}:ro"]
    for env in sidecar.get("env", []):
        args += ["-e", f"{env['name']}={env['value']}"]
    port = free_port()
    container_port = sidecar["ports"][0]["containerPort"]
    name = f"pwk8s{os.getpid()}"
    run = subprocess.run([docker, "run", "-d", "--name", name, *args, "-p",
                          f"127.0.0.1:{port}:{container_port}", tag, *sidecar["args"]],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr

    def logs() -> str:
        proc = subprocess.run([docker, "logs", "--tail", "30", name], capture_output=True,
                              text=True, timeout=30)
        return (proc.stdout + proc.stderr).rstrip()

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, f"no /healthz within 30s; logs:\n{logs()}"
            time.sleep(0.5)
        for command in (["python", "-c", "import matplotlib.pyplot"],
                        ["sh", "-c", "touch \"$HOME/probe\" /tmp/probe "
                                     "/var/log/prefixwatch/probe"]):
            proc = subprocess.run([docker, "exec", name, *command], capture_output=True,
                                  text=True, timeout=60)
            assert proc.returncode == 0 and not proc.stderr, (
                f"{' '.join(command)} in the sidecar: {proc.stderr.strip()}")
        stray = [line for line in logs().splitlines() if not LOG_LINE.match(line)]
        assert not stray, f"the sidecar printed {stray[:5]}"
        start = time.monotonic()
        subprocess.run([docker, "stop", "-t", f"{STOP_WITHIN:g}", name], check=True,
                       capture_output=True, timeout=30)
        elapsed = time.monotonic() - start
        code = subprocess.run([docker, "inspect", "-f", "{{.State.ExitCode}}", name],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        assert code == "0", f"the sidecar exited {code} on SIGTERM; logs:\n{logs()}"
        say(f"kubernetes sidecar on a read-only root: healthy, writable HOME, /tmp and log "
            f"directory, stopped on SIGTERM in {elapsed:.2f}s")
    finally:
        subprocess.run([docker, "rm", "-f", name], capture_output=True, timeout=60)
