"""The `prefixwatch exporter` command as a user runs it: flags, config files, errors."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import requests

from prefixwatch.core.vocab import causes, exposition
from prefixwatch.exporter.config import ConfigError, ConfigFlags, build_config
from tests.conftest import PageServer, free_port, with_counters


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prefixwatch.cli", *args], capture_output=True,
                          text=True, timeout=30, env=env)


@pytest.mark.parametrize("args,message", [
    (["exporter", "--interval", "abc"], "not a duration: 'abc'"),
    (["exporter", "--interval=-5s"], "not a duration"),
    (["status", "--gap", "soon"], "argument --gap: not a duration"),
    (["status", "--cold-start", "later"], "argument --cold-start: not a duration"),
    (["exporter", "--timeout", "inf"], "not a duration"),
    (["demo", "--time-scale", "1e-9"], "argument --time-scale: '1e-9' is out of range"),
    (["demo", "--time-scale", "inf"], "must be a finite number"),
    (["demo", "--time-scale", "nan"], "must be a finite number"),
    (["demo", "--duration", "a while"], "argument --duration: not a duration"),
    (["demo", "--replicas", "0"], "argument --replicas: '0' must be 1 or more"),
    (["demo", "--sim-port", "70000"], "is not a port"),
    (["report", "--since", "yesterday"], "argument --since: not a duration"),
    (["simulate", "--switch-at", "noon"], "argument --switch-at: not a duration"),
    (["exporter", "--log-level", "loud"], "argument --log-level: invalid choice"),
    (["exporter", "--interval", "0"], "greater than 0"),
    (["exporter", "--target", "localhost:8000"], "not an http(s) URL"),
    (["exporter", "--window", "5 minutes"], "not a duration"),
    (["exporter", "--window", "lifetime"], "not a duration"),
    (["exporter", "--config", "/nonexistent/prefixwatch.yml"], "cannot read config file"),
    (["exporter", "--listen-address", "nowhere"], "not HOST:PORT"),
    (["exporter", "--bearer-token-file", "/nonexistent/token"], "does not exist"),
    (["exporter", "--no-such-flag"], "unrecognized arguments"),
    (["exporter", "--follow"], "go with --requests-log PATH"),
    (["exporter", "--requests-log", "/nonexistent/requests.log"], "does not exist"),
    (["exporter", "--diagnosis-window", "soon"], "argument --diagnosis-window: not a duration"),
    (["exporter", "--requests-log", "/dev/null", "--max-log-len", "0"], "must be 1 or more"),
])
def test_bad_flags_exit_2_with_one_line(args: list[str], message: str) -> None:
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("content,message", [
    ("targets: [", "not valid YAML"),
    ("- just\n- a list\n", "must hold a mapping"),
    ("targetz: []\n", "cfg.yml:1:1: unknown key 'targetz' (did you mean 'targets'?)"),
    ("diagnosis: {windw: 5m}\n", "cfg.yml:1:13: unknown key 'diagnosis.windw' (did you mean "
                                 "'window'?)"),
    ("kv_usage_high: 1.5\n", "kv_usage_high must be in (0, 1]"),
    ("diagnosis: {min_requests: many}\n", "diagnosis:"),
    ("requests_log: {follow: true}\n", "needs a path"),
    ("targets:\n  - {name: x}\n", "needs a url"),
    ("targets:\n  - {url: 'http://a:1/metrics', timeout: -1}\n",
     "cfg.yml:2:5: timeout: not a duration: '-1'"),
    ("targets: ['http://a:1/metrics']\ninterval: five\n",
     "cfg.yml:2:1: interval: not a duration: 'five'"),
    ("targets:\n  - {url: 'http://a:1/metrics', colour: red}\n",
     "cfg.yml:2:33: unknown key 'targets.0.colour'"),
    ("targets:\n  - {url: 'http://a:1/metrics', timeot: 2}\n", "(did you mean 'timeout'?)"),
    ("targets:\n  - {name: x}\n", "cfg.yml:2:5: each target needs a url"),
    ("interval: -1\n", "cfg.yml:1:1: interval: not a duration: '-1'"),
    ("windows: [1m, lifetime]\n", "cfg.yml:1:1: not a duration: 'lifetime'"),
    ("targets:\n  - {url: 'http://a:1/m', name: x}\n  - {url: 'http://b:1/m', name: x}\n",
     "share the name"),
])
def test_bad_config_file_exits_2(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "cfg.yml"
    path.write_text(content)
    r = run("exporter", "--config", str(path))
    assert r.returncode == 2 and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_config_precedence(tmp_path) -> None:
    path = tmp_path / "cfg.yml"
    path.write_text("interval: 7\nwindows: [2m]\ntarget_defaults: {timeout: 9}\n"
                    "targets:\n  - url: http://vllm-a:8000/metrics\n"
                    "  - {url: 'http://vllm-b:8000/metrics', name: b}\n")
    cfg = build_config(ConfigFlags(config_file=str(path)), environ={})
    assert cfg.interval == 7 and cfg.windows == ("2m",)
    assert [t.name for t in cfg.targets] == ["vllm-a:8000", "b"]
    assert all(t.timeout == 9 for t in cfg.targets)
    flags = build_config(ConfigFlags(config_file=str(path), targets=["http://x:1/metrics"],
                                     interval=3), environ={})
    assert [t.url for t in flags.targets] == ["http://x:1/metrics"] and flags.interval == 3
    env = build_config(environ={exposition.ENV_TARGETS: "http://e1:1/metrics, http://e2:1/metrics"})
    assert [t.name for t in env.targets] == ["e1:1", "e2:1"]
    default = build_config(environ={})
    assert default.targets[0].url == exposition.DEFAULT_TARGET
    assert default.listen_address == f"0.0.0.0:{exposition.DEFAULT_PORT}"
    same_host = build_config(ConfigFlags(targets=["http://h:1/a", "http://h:1/b"]), environ={})
    assert [t.name for t in same_host.targets] == ["http://h:1/a", "http://h:1/b"]
    with pytest.raises(ConfigError):
        build_config(ConfigFlags(windows=["1m", "lifetime"]), environ={})


def test_example_config_is_valid() -> None:
    example = os.path.join(os.path.dirname(__file__), "..", "exporter",
                           "prefixwatch.example.yml")
    cfg = build_config(ConfigFlags(config_file=example), environ={})
    assert cfg.targets and cfg.interval > 0


_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+/metrics)")


def start_exporter(*args: str) -> tuple[subprocess.Popen, str, list[str]]:
    """`prefixwatch exporter ARGS` on 127.0.0.1:0: the /metrics URL from its own "listening
    on" log line (no port handed over from a closed socket), and its stderr lines so far."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefixwatch.cli", "exporter", "--listen-address", "127.0.0.1:0",
         *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(30, proc.kill)  # a silent exporter ends the read below
    watchdog.start()
    head: list[str] = []
    try:
        for line in proc.stderr:  # type: ignore[union-attr]
            head.append(line)
            if match := _LISTENING.search(line):
                return proc, match.group(1), head
    finally:
        watchdog.cancel()
    proc.kill()
    raise AssertionError(f"the exporter never said where it listens: {''.join(head)[-2000:]}")


def test_exporter_command_end_to_end(page_server: PageServer, vllm_page: str) -> None:
    """`prefixwatch exporter --target URL` against a server serving the fixture, then a
    changed fixture: the right counters and window ratios."""
    page_server.serve(with_counters(vllm_page, 13902, 7168))
    proc, url, head = start_exporter("--target", page_server.url, "--interval", "0.3",
                                     "--window", "1m")

    def scrape() -> str:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                return requests.get(url, timeout=2).text
            except requests.ConnectionError:
                time.sleep(0.1)
        raise AssertionError("exporter did not come up")

    try:
        text = scrape()
        while "prefixwatch_prefix_cache_hits_total{" not in text:
            time.sleep(0.1)
            text = scrape()
        assert "prefixwatch_prefix_cache_queries_total{" in text and " 13902.0" in text
        page_server.serve(with_counters(vllm_page, 14902, 7198))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            text = scrape()
            line = [ln for ln in text.splitlines()
                    if ln.startswith("prefixwatch_prefix_cache_hit_ratio{") and 'window="1m"' in ln]
            if line:
                break
            time.sleep(0.1)
        assert line and float(line[0].rsplit(" ", 1)[1]) == pytest.approx(0.03)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    err = "".join(head) + err
    assert proc.returncode == 0
    assert "listening on" in err and "stopped" in err


def test_listen_port_in_use_exits_2(page_server: PageServer) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = run("exporter", "--target", page_server.url, "--listen-address",
                f"127.0.0.1:{s.getsockname()[1]}")
    assert r.returncode == 2 and "cannot listen" in r.stderr


def test_exporter_command_with_a_requests_log(page_server: PageServer, vllm_page: str,
                                              tmp_path) -> None:
    """The flags reach the request-level view: a JSONL log of token ids, read once, with a
    bad line; the exporter serves the achievable ratio and the line counts."""
    import json

    page_server.serve(with_counters(vllm_page, 13902, 7168))
    shared = list(range(1000, 1064))
    log_path = tmp_path / "requests.jsonl"
    lines = [json.dumps({"prompt_token_ids": shared + [i] * 8}) for i in range(30)]
    lines.insert(5, '{"prompt_token_ids": [1, 2,')  # a line cut by a crash
    log_path.write_text("\n".join(lines) + "\n")
    proc, url, head = start_exporter("--target", page_server.url, "--interval", "0.3",
                                     "--requests-log", str(log_path),
                                     "--requests-tokenizer", "none")
    try:
        deadline = time.monotonic() + 15
        text = ""
        while time.monotonic() < deadline:
            try:
                text = requests.get(url, timeout=2).text
            except requests.ConnectionError:
                text = ""
            if "prefixwatch_achievable_hit_ratio{" in text:
                break
            time.sleep(0.1)
        values = {ln.rsplit(" ", 1)[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
                  if ln.startswith("prefixwatch_")}
        assert values['prefixwatch_requests_log_lines_total{result="request"}'] == 30
        assert values['prefixwatch_requests_log_lines_total{result="skipped"}'] == 1
        achievable = next(v for k, v in values.items()
                          if k.startswith("prefixwatch_achievable_hit_ratio{"))
        assert achievable == pytest.approx(29 * 64 / (30 * 72))  # all but the first hit 4 blocks
        assert sum(1 for k in values if k.startswith("prefixwatch_diagnosis{")) == len(
            causes.CAUSE_NAMES)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=10)
    err = "".join(head) + err
    assert proc.returncode == 0, err
    assert "requests log" in err and "skipped" in err


# -- a newcomer's first errors (issue 17) ------------------------------------------------------

SUBCOMMANDS = [["exporter"], ["status"], ["simulate"], ["rules"], ["dashboards"],
               ["audit", "requests.jsonl"], ["demo"]]


@pytest.mark.parametrize("args", SUBCOMMANDS, ids=lambda a: a[0])
def test_unknown_flag_points_at_the_subcommands_help(args: list[str]) -> None:
    r = run(*args, "--no-such-flag")
    assert r.returncode == 2
    assert r.stderr == (f"prefixwatch {args[0]}: error: unrecognized arguments: --no-such-flag "
                        f"(see prefixwatch {args[0]} --help)\n")


def _closed_reader(*args: str) -> tuple[int, str]:
    """Run with stdout a pipe whose reader is already gone (as `| head` after its lines)."""
    proc = subprocess.Popen([sys.executable, "-m", "prefixwatch.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    return proc.wait(timeout=60), err


def test_broken_pipes_end_quietly_with_exit_0(tmp_path) -> None:
    log = tmp_path / "ids.jsonl"
    log.write_text("".join(f'{{"prompt_token_ids": [{i}, 2, 3, 4, 5]}}\n' for i in range(50)))
    for args in (["simulate", "--list-scenarios"],
                 ["audit", str(log), "--format", "json", "--no-progress"],
                 ["rules"]):
        code, err = _closed_reader(*args)
        assert (code, err) == (0, ""), (args, err)
    shell = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m prefixwatch.cli simulate "
                       "--list-scenarios | head -3"],
        capture_output=True, text=True, timeout=60)
    assert shell.returncode == 0 and shell.stderr == ""
    assert len(shell.stdout.splitlines()) == 3


def test_bad_yaml_names_file_line_and_column(tmp_path) -> None:
    path = tmp_path / "cfg.yml"
    path.write_text("targets:\n  - url: http://a:1/metrics\n   name: x\n")
    r = run("exporter", "--config", str(path))
    assert r.returncode == 2
    assert r.stderr.startswith(f"prefixwatch exporter: error: {path}:3:4: not valid YAML: ")
    assert len(r.stderr.splitlines()) == 1


def test_bad_rules_yaml_names_file_line_and_column(tmp_path) -> None:
    path = tmp_path / "rules.yml"
    path.write_text("threshold: 0.7\nmodels: {a: {threshold: 0.5}\n")
    r = run("rules", "--config", str(path))
    assert r.returncode == 2
    assert r.stderr.startswith(f"prefixwatch rules: error: {path}:3:1: not valid YAML: ")


def _demo(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_TARGETS",
                                                            exposition.ENV_TARGETS)}
    return run("demo", "--sim-port", "0", *args, env=env)


def test_demo_no_prometheus_does_not_claim_it_is_missing() -> None:
    r = _demo("--no-prometheus", "--listen-address", "127.0.0.1:0", "--duration", "1s",
              "--rate", "1")
    assert r.returncode == 0, r.stderr
    assert "Prometheus/Alertmanager: not started (--no-prometheus)" in r.stdout
    assert "not installed" not in r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def test_demo_port_in_use_names_its_owner() -> None:
    import socket

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    try:
        r = _demo("--no-prometheus", "--listen-address", f"127.0.0.1:{port}")
        assert r.returncode == 2
        assert r.stderr.startswith(
            f"prefixwatch demo: error: port {port} on 127.0.0.1 for the exporter is in use, "
            f"held by pid {os.getpid()} (")
        assert r.stderr.endswith("; choose another with --listen-address\n")
        assert len(r.stderr.splitlines()) == 1
        if shutil.which("prometheus") and shutil.which("prometheus-alertmanager"):
            r = _demo("--listen-address", "127.0.0.1:0", "--prometheus-port", str(free_port()),
                      "--alertmanager-port", str(port))
            assert r.returncode == 2 and "for Alertmanager is in use, held by pid" in r.stderr
            assert "--alertmanager-port" in r.stderr and len(r.stderr.splitlines()) == 1
    finally:
        listener.close()


@pytest.mark.parametrize("args,message", [
    (["--time-scale", "0"], "--time-scale: '0' must be a finite number greater than 0"),
    (["--switch-at", "soon"], "not a duration"),
    (["--replicas", "0"], "--replicas: '0' must be 1 or more"),
    (["--replicas", "65"], "--replicas must be between 1 and 64"),
])
def test_demo_bad_flags_exit_2(args: list[str], message: str) -> None:
    r = _demo("--no-prometheus", *args)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.splitlines()) == 1


def test_lazy_subcommands_list_their_modules_own_help() -> None:
    """`prefixwatch --help` lists each product's sub-command without importing it; the line it
    shows is the one the product's own parser declares."""
    import argparse

    from prefixwatch.cli import PRODUCT_COMMANDS, build_parser

    sub = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    listed = [a.dest for a in sub._choices_actions]
    for name, (summary, _, _, _) in PRODUCT_COMMANDS.items():
        real = sub.build(name)
        assert isinstance(real, argparse.ArgumentParser) and real.prog == f"prefixwatch {name}"
        shown = {a.dest: a.help for a in sub._choices_actions}
        assert shown[name] == summary, (
            f"{name}: the table says {summary!r}, the module {shown[name]!r}")
        assert real._actions, f"{name}: the real parser was not built"
    assert [a.dest for a in sub._choices_actions] == listed, "the listing keeps its order"


@pytest.mark.parametrize("args,absent", [
    (["--help"], ("prefixwatch.exporter", "prefixwatch.mixin", "prefixwatch.report",
                  "prefixwatch.audit", "prefixwatch.simulator", "prefixwatch.demo")),
    (["exporter", "--help"], ("prefixwatch.exporter.service", "prefixwatch.exporter.config",
                              "prefixwatch.mixin", "numpy", "requests", "prometheus_client")),
    (["status", "--help"], ("prefixwatch.exporter.status", "prefixwatch.exporter.monitor",
                            "numpy", "matplotlib")),
    (["report", "--help"], ("matplotlib", "jinja2", "prefixwatch.exporter")),
    (["rules", "--help"], ("prefixwatch.report", "prefixwatch.exporter", "matplotlib")),
])
def test_help_imports_only_what_it_shows(args: list[str], absent: tuple[str, ...]) -> None:
    code = ("import sys\nfrom prefixwatch.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\nprint(' '.join(sorted(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.splitlines()[-1].split())
    found = [m for m in absent if m in loaded]
    assert not found, f"prefixwatch {' '.join(args)} imported {found}"


@pytest.mark.parametrize("argv,flag,value", [
    (["status", "--gap", "1s"], "gap", 1.0),
    (["status", "--gap", "2"], "gap", 2.0),
    (["status", "--cold-start", "30"], "cold_start", "30s"),
    (["status", "--cold-start", "30s"], "cold_start", "30s"),
    (["exporter", "--interval", "500ms"], "interval", 0.5),
    (["exporter", "--timeout", "3"], "timeout", 3.0),
    (["demo", "--duration", "3"], "duration", 3.0),
    (["demo", "--duration", "5m"], "duration", 300.0),
    (["report", "--prometheus", "http://127.0.0.1:9090", "--since", "1h"], "since", 3600.0),
])
def test_every_duration_takes_units_or_bare_seconds(argv: list[str], flag: str,
                                                    value: object) -> None:
    from prefixwatch.cli import _parse, build_parser

    assert getattr(_parse(build_parser(), argv), flag) == value


@pytest.mark.parametrize("argv", [
    ["--log-level", "warning", "exporter"],
    ["exporter", "--log-level", "warning"],
    ["exporter", "--log-level=warning"],
    ["status", "--log-level", "warning", "--gap", "1s"],
])
def test_global_options_before_or_after_the_command(argv: list[str]) -> None:
    from prefixwatch.cli import _parse, build_parser

    assert _parse(build_parser(), argv).log_level == "warning"


def test_top_level_help_starts_with_the_demo() -> None:
    r = run("--help")
    assert r.returncode == 0
    assert "Start here: prefixwatch demo --time-scale 0.05" in " ".join(r.stdout.split())
    commands = re.findall(r"^    (\S+)\s", r.stdout, re.M)
    assert commands[0] == "demo", commands


def _help_texts() -> str:
    from prefixwatch.cli import PRODUCT_COMMANDS

    names_ = ["exporter", "status", "example-config", *PRODUCT_COMMANDS]
    return "\n".join(run(name, "--help").stdout for name in names_)


def test_help_points_only_to_what_an_installed_package_has() -> None:
    """No help text names a file of the repository (an installed package has none); the
    example configs they point to print from the package itself, equal to the repository's."""
    from pathlib import Path

    texts = _help_texts()
    assert not re.search(r"\b\w+/[\w.-]+\.example\.yml", texts), texts
    assert not re.search(r"(?<![/\w])docs/\w", " ".join(texts.split())), texts
    assert "prefixwatch example-config exporter" in " ".join(texts.split())
    root = Path(__file__).resolve().parents[1]
    for which, repo_copy in (("exporter", "exporter/prefixwatch.example.yml"),
                             ("mixin", "alerts/mixin.example.yml")):
        r = run("example-config", which)
        assert r.returncode == 0, r.stderr
        assert r.stdout == (root / repo_copy).read_text(), which


def test_placeholders_are_named_alike() -> None:
    """One name per kind of value: N for a count, PORT, DURATION; never the flag's own name."""
    texts = _help_texts()
    for flag, shown in re.findall(r"--([a-z][a-z-]*) ([A-Z_]+)\b", texts):
        assert flag.replace("-", "_").upper() not in (shown, "") or shown in (
            "DURATION", "PORT", "HOST"), f"--{flag} {shown}: name the kind of value"
    for flag in ("--replicas", "--sim-port", "--port", "--gap", "--interval", "--timeout",
                 "--duration", "--since", "--cold-start"):
        shown = set(re.findall(re.escape(flag) + r" ([A-Z_]+)", texts))
        assert len(shown) <= 1 and not shown & {"P", "SECONDS", "REPLICAS"}, (flag, shown)
