"""Local stand-ins for the upstream images the stack pins, built from Debian's own packages.

No image registry is reachable here, so `docker compose up` can only run on images built
locally. Each stand-in carries exactly the tag the project pins (read from docker-compose.yml
and exporter/Dockerfile, so a bump cannot desynchronise them) and the upstream image's layout:

- the Python base (`python:X.Y.Z-slim-bookworm`): a bookworm root filesystem from debootstrap
  (`--variant=minbase`, with python3, python3-venv, wget and ca-certificates), imported with
  `docker import`, then `python3 -m venv /usr/local`, which gives the official image's
  `/usr/local/bin/python`, `pip` and `/usr/local/lib/python3.11/site-packages`. The host's CA
  bundle is copied in and named by PIP_CERT, so pip inside `docker build` trusts what the host
  trusts;
- Prometheus and Alertmanager (`prom/prometheus`, `prom/alertmanager`): Debian's binaries (the
  host's `prometheus` and `prometheus-alertmanager` packages) on that base in the upstream
  layout: entrypoint `/bin/prometheus` / `/bin/alertmanager`, configuration under
  `/etc/prometheus` / `/etc/alertmanager`, the data directory owned by nobody, `USER nobody`,
  and wget for the healthchecks; Debian's Alertmanager reads its templates from
  `/usr/share/prometheus/alertmanager/`.

Grafana has no Debian package, so it gets no stand-in. What is built is cached: the root
filesystem as a tarball under the cache directory, the images in the engine, each labelled with
a key of its recipe; a later run reuses what matches and rebuilds what does not.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "wget", "ca-certificates")
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
KEY_LABEL = "org.prefixwatch.standin"
BASE_REPO = "prefixwatch-standin/bookworm"
DEBOOTSTRAP_TIMEOUT = 600
BUILD_TIMEOUT = 600


class StandinUnavailable(Exception):
    """This machine cannot build the stand-ins (no debootstrap, or not root)."""


@dataclass(frozen=True)
class Pins:
    """The upstream images the project pins, by role."""

    python: str
    prometheus: str
    alertmanager: str
    grafana: str | None


def read_pins(root: Path) -> Pins:
    """The tags as docker-compose.yml and exporter/Dockerfile spell them."""
    froms = set(re.findall(r"^FROM\s+(\S+)", (root / "exporter" / "Dockerfile").read_text(),
                           re.M))
    if len(froms) != 1:
        raise AssertionError(f"exporter/Dockerfile should build on one base image, not {froms}")
    services = yaml.safe_load((root / "docker-compose.yml").read_text())["services"]

    def image(prefix: str) -> str | None:
        found = {s["image"] for s in services.values() if s.get("image", "").startswith(prefix)}
        if len(found) > 1:
            raise AssertionError(f"docker-compose.yml pins {prefix} twice: {found}")
        return found.pop() if found else None

    prometheus, alertmanager = image("prom/prometheus:"), image("prom/alertmanager:")
    if not prometheus or not alertmanager:
        raise AssertionError("docker-compose.yml has no prom/prometheus or prom/alertmanager")
    return Pins(froms.pop(), prometheus, alertmanager, image("grafana/grafana:"))


def _key(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:16]


BASE_TAG = f"{BASE_REPO}:{_key(SUITE, *PACKAGES)}"


def _file_key(path: Path) -> str:
    return _key(path.read_bytes()) if path.is_file() else _key(str(path))


def _python_dockerfile(base: str, version: str) -> str:
    return f"""FROM {base}
COPY host-ca-certificates.crt /etc/ssl/certs/host-ca-certificates.crt
RUN python3 -m venv /usr/local && /usr/local/bin/pip --version
ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin \\
    LANG=C.UTF-8 \\
    PYTHON_VERSION={version} \\
    PIP_CERT=/etc/ssl/certs/host-ca-certificates.crt \\
    PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    PIP_DEFAULT_TIMEOUT=60
CMD ["python3"]
"""


PROMETHEUS_YML = """global:
  scrape_interval: 15s
scrape_configs:
- job_name: prometheus
  static_configs:
  - targets: [localhost:9090]
"""

ALERTMANAGER_YML = """route:
  receiver: default
receivers:
- name: default
"""


def _server_dockerfile(base: str, name: str, tool: str, share: tuple[str, str], port: int,
                       storage_flag: str) -> str:
    """A Prometheus-project server in the upstream image's layout: /bin/NAME as entrypoint,
    its config in /etc/NAME, its data in /NAME owned by nobody, running as nobody."""
    return f"""FROM {base}
COPY {name} {tool} /bin/
COPY {share[0]} {share[1]}
COPY {name}.yml /etc/{name}/{name}.yml
RUN install -d -o nobody -g nogroup /{name}
USER nobody
EXPOSE {port}
VOLUME ["/{name}"]
WORKDIR /{name}
ENTRYPOINT ["/bin/{name}"]
CMD ["--config.file=/etc/{name}/{name}.yml", "{storage_flag}=/{name}"]
"""


def _prometheus_dockerfile(base: str) -> str:
    return _server_dockerfile(base, "prometheus", "promtool", ("web", "/usr/share/prometheus/web"),
                              9090, "--storage.tsdb.path")


def _alertmanager_dockerfile(base: str) -> str:
    return _server_dockerfile(base, "alertmanager", "amtool",
                              ("templates", "/usr/share/prometheus/alertmanager"), 9093,
                              "--storage.path")


class StandinBuilder:
    """Builds (or finds, by key) the stand-ins for one set of pins."""

    def __init__(self, docker: str, cache: Path, say: Callable[[str], None]) -> None:
        self.docker = docker
        self.cache = cache
        self.say = say

    def _run(self, args: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            raise AssertionError(f"`{' '.join(args[:4])} ...` failed ({proc.returncode}):\n{tail}")
        return proc

    def image_key(self, tag: str) -> str | None:
        proc = subprocess.run(
            [self.docker, "image", "inspect", "--format",
             "{{ index .Config.Labels \"" + KEY_LABEL + "\" }}", tag],
            capture_output=True, text=True, timeout=60)
        return proc.stdout.strip() if proc.returncode == 0 else None

    def rootfs(self) -> Path:
        """The debootstrapped root filesystem as a tarball, cached."""
        tarball = self.cache / f"{SUITE}-minbase-{BASE_TAG.rsplit(':', 1)[1]}.tar"
        if tarball.exists():
            return tarball
        debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
        if not Path(debootstrap).exists():
            raise StandinUnavailable("debootstrap is not installed: run `apt-get install "
                                     "debootstrap` (Debian)")
        if os.geteuid() != 0:
            raise StandinUnavailable(f"building the stand-in images needs debootstrap as root "
                                     f"once (then cached in {self.cache})")
        self.cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.cache) as tmp:
            target = Path(tmp) / "rootfs"
            self.say(f"debootstrap {SUITE} (minbase + {', '.join(PACKAGES)}), about a minute")
            started = time.monotonic()
            self._run([debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}",
                       SUITE, str(target)], DEBOOTSTRAP_TIMEOUT)
            self.say(f"debootstrap done in {time.monotonic() - started:.0f}s")
            for leftover in (target / "var/cache/apt/archives").glob("*.deb"):
                leftover.unlink()
            partial = tarball.with_suffix(".partial")
            self._run(["tar", "--numeric-owner", "-C", str(target), "-cf", str(partial), "."],
                      DEBOOTSTRAP_TIMEOUT)
            partial.rename(tarball)
        return tarball

    def base(self) -> str:
        """The imported root filesystem, tagged by its key."""
        tag = BASE_TAG
        if self.image_key(tag) is None:
            tarball = self.rootfs()
            self.say(f"docker import {tarball.name} as {tag}")
            self._run([self.docker, "import", "--change", f"LABEL {KEY_LABEL}={tag}",
                       "--change", 'CMD ["/bin/bash"]', str(tarball), tag], BUILD_TIMEOUT)
        return tag

    def _build(self, tag: str, dockerfile: str, files: dict[str, Path | str], key: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            context = Path(tmp)
            (context / "Dockerfile").write_text(dockerfile)
            for name, source in files.items():
                dest = context / name
                if isinstance(source, str):
                    dest.write_text(source)
                elif source.is_dir():
                    shutil.copytree(source, dest, symlinks=False)
                else:
                    shutil.copy2(source, dest)
            self._run([self.docker, "build", "--label", f"{KEY_LABEL}={key}", "-t", tag,
                       str(context)], BUILD_TIMEOUT)

    def ensure(self, pins: Pins) -> dict[str, str]:
        """Every stand-in present under its pinned tag; returns how each one was had."""
        how: dict[str, str] = {}
        prom = shutil.which("prometheus") or "/usr/bin/prometheus"
        am = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
        promtool = shutil.which("promtool") or "/usr/bin/promtool"
        amtool = shutil.which("amtool") or "/usr/bin/amtool"
        web = Path("/usr/share/prometheus/web")
        templates = Path("/usr/share/prometheus/alertmanager")
        version = pins.python.split(":", 1)[1].split("-", 1)[0]
        base_built = False
        recipes = [
            (pins.python, lambda b: _python_dockerfile(b, version),
             {"host-ca-certificates.crt": HOST_CA}),
            (pins.prometheus, _prometheus_dockerfile,
             {"prometheus": Path(prom), "promtool": Path(promtool), "web": web,
              "prometheus.yml": PROMETHEUS_YML}),
            (pins.alertmanager, _alertmanager_dockerfile,
             {"alertmanager": Path(am), "amtool": Path(amtool), "templates": templates,
              "alertmanager.yml": ALERTMANAGER_YML}),
        ]
        for tag, recipe, files in recipes:
            key = _key(tag, recipe(BASE_TAG), *(
                source if isinstance(source, str) else _file_key(source)
                for source in files.values()))
            if self.image_key(tag) == key:
                how[tag] = "cached"
                continue
            if not base_built:
                self.base()
                base_built = True
            self.say(f"building stand-in {tag}")
            self._build(tag, recipe(BASE_TAG), files, key)
            how[tag] = "built"
        return how
