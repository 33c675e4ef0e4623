"""`prefixwatch simulate`: vLLM-faithful replicas plus a built-in workload."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from typing import IO

from prefixwatch.core import cliargs
from prefixwatch.core.errors import ConfigError
from prefixwatch.simulator.driver import Driver, get_scenario
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.kvpublisher import KVEventsOptions
from prefixwatch.simulator.logfile import RotatingFile
from prefixwatch.simulator.requestlog import RequestLogger
from prefixwatch.simulator.scenarios import Scenario, describe
from prefixwatch.simulator.server import Replica, ReplicaServer
from prefixwatch.simulator.via import check_via

log = logging.getLogger("prefixwatch.simulate")


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    defaults = EngineConfig()
    p = sub.add_parser(
        "simulate", help="serve simulated vLLM replicas with a built-in workload",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve one or more replicas that speak vLLM's API and /metrics format and "
                    "cache prefixes by vLLM V1's rule (chained full blocks, LRU eviction), "
                    "and drive them with a named scenario.\n\nThe built-in tokenizer is not a "
                    "real model's: token counts differ from Llama's, the caching rule does not.",
        epilog="Example: prefixwatch simulate --replicas 2 --scenario static-system-prompt "
               "--switch-at 5m --switch-to timestamp-at-top")
    p.add_argument("--list-scenarios", action="store_true", help="explain each scenario, exit")
    p.add_argument("--scenario", default="static-system-prompt", metavar="NAME",
                   help="workload to run (default static-system-prompt; see --list-scenarios)")
    p.add_argument("--rate", type=cliargs.non_negative, default=4.0, metavar="REQ_PER_S",
                   help="requests per second over all replicas (default 4; 0 = serve only)")
    p.add_argument("--switch-at", type=cliargs.duration, metavar="DURATION",
                   help="switch to --switch-to after this long, e.g. 10m (a bad deploy)")
    p.add_argument("--switch-to", metavar="NAME", help="scenario to switch to")
    p.add_argument("--via", metavar="URL",
                   help="send the workload through this router (vllm-router, smg, a gateway: "
                        "its base URL) instead of choosing replicas; the replicas still serve "
                        "and publish their KV events")
    p.add_argument("--restart-at", type=cliargs.duration, metavar="DURATION",
                   help="restart every replica once after this long (cold cache, counters reset)")
    p.add_argument("--replicas", type=int, metavar="N",
                   help="number of replicas (default: the scenario's, usually 1)")
    p.add_argument("--host", default="127.0.0.1", metavar="HOST",
                   help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, metavar="PORT",
                   help="first port; replica i listens on PORT+i (default 8000)")
    p.add_argument("--routing", choices=["round-robin", "prefix-affinity"],
                   help="how the workload spreads over replicas (default: the scenario's)")
    p.add_argument("--engine", choices=["vllm", "sglang"], default="vllm",
                   help="the engine each replica stands in for: vllm (vLLM V1's block cache, "
                        "metrics and KV events) or sglang (SGLang's radix cache, metrics and "
                        "KV events) (default vllm)")
    p.add_argument("--page-size", type=int, default=defaults.page_size, metavar="N",
                   help="with --engine sglang: tokens per page SGLang's radix cache matches "
                        f"and stores by, as SGLang's --page-size (default {defaults.page_size})")
    p.add_argument("--model", default=defaults.model, metavar="NAME",
                   help=f"model name (default {defaults.model})")
    p.add_argument("--block-size", type=int, default=defaults.block_size, metavar="N",
                   help=f"tokens per KV block (default {defaults.block_size})")
    p.add_argument("--kv-blocks", type=int, metavar="N",
                   help=f"KV pool size per replica in blocks (default: the scenario's, "
                        f"else {defaults.num_blocks}; SGLang's pool holds the same tokens, "
                        f"N x --block-size)")
    p.add_argument("--offload-blocks", type=int, metavar="N",
                   help="give each replica a host (CPU) KV tier of N blocks, as vLLM's "
                        "SimpleCPUOffloadConnector (SGLang: HiCache host pool); default: the "
                        "scenario's, else none")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="switch prefix caching off (as vLLM's --no-enable-prefix-caching)")
    p.add_argument("--kv-cache-metrics", action="store_true",
                   help="also serve vLLM's block-residency histograms (lifetime, idle before "
                        "eviction, reuse gaps), as vLLM's --kv-cache-metrics")
    p.add_argument("--kv-cache-metrics-sample", type=float,
                   default=defaults.kv_cache_metrics_sample, metavar="RATE",
                   help=f"share of blocks tracked, as vLLM's flag (default "
                        f"{defaults.kv_cache_metrics_sample:g})")
    p.add_argument("--max-model-len", type=int, default=defaults.max_model_len, metavar="N",
                   help=f"longest prompt plus output (default {defaults.max_model_len})")
    p.add_argument("--prefill-tokens-per-s", type=float, metavar="N",
                   default=defaults.prefill_tokens_per_s,
                   help=f"modelled prefill throughput (default {defaults.prefill_tokens_per_s:g})")
    p.add_argument("--time-per-output-token", type=float, metavar="SECONDS",
                   default=defaults.time_per_output_token,
                   help=f"modelled decode time per token in seconds "
                        f"(default {defaults.time_per_output_token:g})")
    p.add_argument("--request-log", metavar="FILE",
                   help="write vLLM-format request log lines (as --enable-log-requests with "
                        "VLLM_LOGGING_LEVEL=DEBUG) to FILE, '-' for stdout")
    p.add_argument("--max-log-len", type=int, metavar="N",
                   help="cut logged prompts and token ids at N, as vLLM's --max-log-len")
    p.add_argument("--request-log-max-mb", type=cliargs.non_negative, default=0, metavar="MB",
                   help="rotate the --request-log FILE to FILE.1 when it reaches MB megabytes "
                        "(default 0: never; the log grows about 300 MB an hour at 4 req/s)")
    p.add_argument("--kv-events-port", type=int, metavar="N",
                   help="publish the engine's KV cache event stream (ZMQ PUB, vLLM 0.33's "
                        "wire format, or SGLang's with --engine sglang): replica i binds "
                        "tcp://HOST:N+i, as `vllm serve "
                        "--kv-events-config '{\"enable_kv_cache_events\": true, \"publisher\": "
                        "\"zmq\", \"endpoint\": \"tcp://*:N\"}'` does (0 = free ports; "
                        "default: off)")
    p.add_argument("--kv-events-topic", default="", metavar="TOPIC",
                   help="ZMQ topic of every KV event message (default '', as vLLM's)")
    p.add_argument("--kv-events-replay-port", type=int, metavar="N",
                   help="also serve vLLM's replay endpoint (ROUTER): replica i binds "
                        "tcp://HOST:N+i and resends buffered messages from a sequence number")
    p.add_argument("--seed", type=int, default=1, metavar="N",
                   help="workload random seed (default 1)")
    p.add_argument("--duration", type=cliargs.duration, metavar="DURATION",
                   help="stop after this long (default: run until Ctrl-C)")


class Simulation:
    """Replicas, their HTTP servers and the workload driver, started and stopped together.

    ``stop`` is safe at any point: before ``start``, after a ``start`` that failed half-way,
    or twice; it stops what runs and closes what was only bound."""

    def __init__(self, servers: list[ReplicaServer], driver: Driver | None,
                 log_stream: IO[str] | RotatingFile | None) -> None:
        self.servers = servers
        self.driver = driver
        self._log_stream = log_stream
        self._started: list[ReplicaServer] = []
        self._driver_started = False
        self._stopped = False

    @property
    def urls(self) -> list[str]:
        return [f"http://{s.httpd.server_address[0]}:{s.port}/metrics" for s in self.servers]

    @property
    def kv_events_endpoints(self) -> list[str]:
        """Each replica's bound KV event endpoint (empty without --kv-events-port)."""
        return [s.replica.kv_publisher.endpoint for s in self.servers
                if s.replica.kv_publisher is not None]

    def start(self) -> None:
        for s in self.servers:
            s.start()
            self._started.append(s)
        if self.driver is not None:
            self.driver.start()
            self._driver_started = True

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.driver is not None and self._driver_started:
            self.driver.stop()
            log.info("sent %d requests, %d rejected", self.driver.sent, self.driver.rejected)
        for s in self.servers:
            if s in self._started:
                s.stop()
            else:
                s.httpd.server_close()  # bound, never served: shutdown() would wait forever
                s.replica.close()
        if self._log_stream is not None and self._log_stream is not sys.stdout:
            self._log_stream.close()


def build_simulation(args: argparse.Namespace) -> Simulation:
    """Validate the simulate flags and bind every replica's port; ConfigError on bad input."""
    scenario, switch_to = _scenarios(args)
    via = _via(args)
    replicas_n = _replica_count(args, scenario, switch_to)
    config = _engine_config(args, scenario)
    log_stream, request_log = _open_request_log(args)
    kv_events = _kv_events_options(args, replicas_n)
    adapters = tuple(sorted(set(scenario.lora_modules) | set(
        switch_to.lora_modules if switch_to else ())))
    servers = _bind_replicas(args, config, replicas_n, adapters, request_log, kv_events,
                             log_stream)
    driver = None
    if args.rate > 0:
        driver = Driver([s.replica for s in servers], scenario, args.rate, seed=args.seed,
                        switch_at=args.switch_at, switch_to=switch_to, routing=args.routing,
                        restart_at=args.restart_at, via=via)
    _log_serving(args, servers, config)
    if driver is not None:
        log.info("workload %s at %g req/s over %d replica(s)%s%s", scenario.name, args.rate,
                 replicas_n, f" through the router at {via}" if via else "",
                 f"; switching to {switch_to.name} after {args.switch_at:g}s"
                 if switch_to else "")
    else:
        log.info("no built-in workload (--rate 0): serving only")
    return Simulation(servers, driver, log_stream)


def _via(args: argparse.Namespace) -> str | None:
    """The router's base URL of --via (None: the workload chooses replicas itself)."""
    if not getattr(args, "via", None):
        return None
    try:
        return check_via(args.via)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _scenarios(args: argparse.Namespace) -> tuple[Scenario, Scenario | None]:
    """The scenario to run and the one to switch to (None: no switch)."""
    try:
        scenario = get_scenario(args.scenario)
        switch_to = get_scenario(args.switch_to) if args.switch_to else None
    except KeyError as exc:
        raise ConfigError(exc.args[0]) from None
    if (args.switch_at is None) != (switch_to is None):
        raise ConfigError("--switch-at and --switch-to go together")
    return scenario, switch_to


def _replica_count(args: argparse.Namespace, scenario: Scenario,
                   switch_to: Scenario | None) -> int:
    """--replicas, else as many as either scenario needs; their ports must fit."""
    replicas_n = args.replicas or max(scenario.replicas, switch_to.replicas if switch_to else 1)
    if replicas_n < 1 or replicas_n > 64:
        raise ConfigError("--replicas must be between 1 and 64")
    if not 0 <= args.port < 65536 or args.port + replicas_n - 1 >= 65536:
        raise ConfigError("--port is out of range")
    return replicas_n


def _engine_config(args: argparse.Namespace, scenario: Scenario) -> EngineConfig:
    """Each replica's engine: the flags, else the scenario's pool sizes, else the defaults."""
    num_blocks = args.kv_blocks or scenario.num_blocks or EngineConfig().num_blocks
    if args.block_size < 1 or num_blocks < 2:
        raise ConfigError("--block-size must be >= 1 and --kv-blocks >= 2")
    page_size = getattr(args, "page_size", 1)
    if page_size < 1 or page_size > num_blocks * args.block_size:
        raise ConfigError("--page-size must be >= 1 and fit the KV pool")
    if page_size != 1 and args.engine != "sglang":
        raise ConfigError("--page-size is SGLang's: give it with --engine sglang (vLLM's "
                          "unit is --block-size)")
    offload_blocks = (args.offload_blocks if args.offload_blocks is not None
                      else scenario.offload_blocks or 0)
    if offload_blocks < 0:
        raise ConfigError("--offload-blocks must be 0 or more")
    config = EngineConfig(
        model=args.model, block_size=args.block_size, num_blocks=num_blocks,
        enable_prefix_caching=not args.no_prefix_caching, max_model_len=args.max_model_len,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        time_per_output_token=args.time_per_output_token,
        kv_cache_metrics=args.kv_cache_metrics,
        kv_cache_metrics_sample=args.kv_cache_metrics_sample, offload_blocks=offload_blocks,
        page_size=page_size)
    if not 0 <= args.kv_cache_metrics_sample <= 1:
        raise ConfigError("--kv-cache-metrics-sample must be between 0 and 1")
    return config


def _open_request_log(args: argparse.Namespace
                      ) -> tuple[IO[str] | RotatingFile | None, RequestLogger | None]:
    """(the stream, the logger) of --request-log; (None, None) without it."""
    if not args.request_log:
        return None, None
    max_bytes = int(args.request_log_max_mb * 1024 * 1024)
    log_stream: IO[str] | RotatingFile
    try:
        if args.request_log == "-":
            log_stream = sys.stdout
        elif max_bytes:
            log_stream = RotatingFile(args.request_log, max_bytes)
        else:
            log_stream = open(args.request_log, "a", encoding="utf-8")  # noqa: SIM115
    except OSError as exc:
        raise ConfigError(f"cannot open {args.request_log}: {exc.strerror}") from exc
    return log_stream, RequestLogger(log_stream, args.max_log_len)  # type: ignore[arg-type]


def _bind_replicas(args: argparse.Namespace, config: EngineConfig, replicas_n: int,
                   adapters: tuple[str, ...], request_log: RequestLogger | None,
                   kv_events: KVEventsOptions | None,
                   log_stream: IO[str] | RotatingFile | None) -> list[ReplicaServer]:
    """Every replica bound to its port; on a failure, what was bound (and the log) is
    closed and the error is a ConfigError."""
    servers: list[ReplicaServer] = []
    replica = None
    try:
        for i in range(replicas_n):
            replica = None
            replica = Replica(config, index=i, server=args.engine, lora_modules=adapters,
                              request_log=request_log, kv_events=kv_events)
            port = args.port + i if args.port else 0
            servers.append(ReplicaServer(replica, args.host, port))
    except OSError as exc:
        if replica is not None and all(s.replica is not replica for s in servers):
            replica.close()
        Simulation(servers, None, log_stream).stop()  # closes what was bound, and the log
        raise ConfigError(str(exc.strerror or exc)) from exc
    return servers


def _log_serving(args: argparse.Namespace, servers: list[ReplicaServer],
                 config: EngineConfig) -> None:
    """Where each replica serves, and where it publishes its KV events."""
    for s in servers:
        log.info("replica %d (%s, %s) on http://%s:%d  (/metrics, /v1/chat/completions, "
                 "/v1/completions, /tokenize)", s.replica.index, args.engine, config.model,
                 args.host, s.port)
        publisher = s.replica.kv_publisher
        if publisher is not None:
            log.info("replica %d publishes KV events on %s (topic %r)%s", s.replica.index,
                     publisher.endpoint, args.kv_events_topic,
                     f", replay on {publisher.replay_endpoint}"
                     if publisher.replay_endpoint else "")


def _kv_events_options(args: argparse.Namespace, replicas: int) -> KVEventsOptions | None:
    """The publisher settings from --kv-events-port/-topic/-replay-port; ConfigError if bad."""
    port = getattr(args, "kv_events_port", None)
    replay = getattr(args, "kv_events_replay_port", None)
    if port is None:
        if replay is not None:
            raise ConfigError("--kv-events-replay-port needs --kv-events-port")
        return None
    for flag, value in (("--kv-events-port", port), ("--kv-events-replay-port", replay)):
        if value is not None and (not 0 <= value < 65536 or (
                value and value + replicas - 1 >= 65536)):
            raise ConfigError(f"{flag} is out of range")
    ranges = [(flag, value) for flag, value in (("--port", args.port), ("--kv-events-port", port),
                                                 ("--kv-events-replay-port", replay)) if value]
    for i, (flag_a, a) in enumerate(ranges):
        for flag_b, b in ranges[i + 1:]:
            if abs(a - b) < replicas:
                raise ConfigError(f"{flag_a} and {flag_b} overlap: replica i uses each port + i")
    host = "*" if args.host in ("0.0.0.0", "::", "") else args.host
    return KVEventsOptions(endpoint=f"tcp://{host}:{port}", topic=args.kv_events_topic,
                           replay_endpoint=f"tcp://{host}:{replay}" if replay is not None
                           else None)


#: How often the main thread looks for a signal that reached another of its threads.
SIGNAL_SLICE = 0.2


def wait_for_signal(duration: float | None = None) -> signal.Signals | None:
    """Block until SIGINT (Ctrl-C), SIGTERM or SIGHUP (the terminal closed) or ``duration``
    seconds; return the signal, or None when the duration ended it. SIGHUP is handled so that
    children in sessions of their own (the demo's Prometheus) are stopped, not orphaned."""
    stop = threading.Event()
    received: list[signal.Signals] = []

    def handler(signum: int, _frame: object) -> None:
        sig = signal.Signals(signum)
        log.info("received %s, stopping", sig.name)
        received.append(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    # In slices: the kernel may deliver a process's signal to any of its threads, and then
    # only the main thread's next bytecode runs the handler; one long wait would miss it
    # until it timed out (the demo then ignored Ctrl-C or SIGTERM for its whole duration).
    deadline = None if duration is None else time.monotonic() + duration
    while not stop.is_set():
        left = SIGNAL_SLICE if deadline is None else min(SIGNAL_SLICE, deadline - time.monotonic())
        if left <= 0:
            break
        stop.wait(left)
    return received[0] if received else None


def run_simulate(args: argparse.Namespace) -> int:
    if args.list_scenarios:
        print(describe())
        return 0
    sim = build_simulation(args)
    sim.start()
    wait_for_signal(args.duration)
    sim.stop()
    return 0


def simulation_args(**overrides: object) -> argparse.Namespace:
    """The `simulate` flags' defaults, with some set: for callers that embed a simulation."""
    parser = argparse.ArgumentParser()
    add_simulate_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["simulate"])
    for key, value in overrides.items():
        if not hasattr(args, key):
            raise AttributeError(f"no simulate option {key!r}")
        setattr(args, key, value)
    return args
