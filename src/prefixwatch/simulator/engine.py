"""One simulated vLLM replica: a scheduler loop over a BlockPool, with vLLM's bookkeeping.

Time is modelled, not spent on a GPU: a request's prefill takes its *uncached* tokens over a
prefill throughput, queued behind the prefills before it, and each output token takes a fixed
time. So a lower hit rate shows as a higher TTFT, as in production. The scheduler runs in
steps (``step(now)``), driven by a thread in real time or by a caller in virtual time.

Simplifications, stated: a prompt is prefilled in one piece (no chunked prefill); prefills run
one after another; decodes run in parallel. Cached-token counts are exact for requests that
are scheduled one after another (what vLLM does unless two requests land in one step while
the first is still chunk-prefilling).
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prefixwatch.core.cache.blockcache import BlockPool, Node, Residency
from prefixwatch.simulator.kvpublisher import KVEvents
from prefixwatch.simulator.offload import LOAD_SPEEDUP, HostTier


class PrefixStore(Protocol):
    """Where an engine caches prompts (vLLM's block pool, SGLang's radix tree): what the KV
    event stream is attached to, what a restart and a prefix-cache reset empty, what the KV
    usage gauge reads."""

    events: Any

    def reset(self) -> None: ...

    def usage(self) -> float: ...


@dataclass
class EngineConfig:
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    block_size: int = 16
    num_blocks: int = 8192
    enable_prefix_caching: bool = True
    max_model_len: int = 32768
    max_num_seqs: int = 256
    prefill_tokens_per_s: float = 16000.0
    time_per_output_token: float = 0.01
    base_latency: float = 0.002
    max_waiting: int = 4096
    #: vLLM's --kv-cache-metrics and --kv-cache-metrics-sample (block-residency histograms).
    kv_cache_metrics: bool = False
    kv_cache_metrics_sample: float = 0.01
    #: Host (CPU) tier per replica in blocks, as vLLM's SimpleCPUOffloadConnector; 0 = none.
    offload_blocks: int = 0
    #: SGLang's --page-size (the SGLang engine's matching granularity; vLLM's is block_size).
    page_size: int = 1


@dataclass
class SimRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int
    extra_keys: Hashable = None
    arrival: float = 0.0
    # Filled by the engine.
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    path: list[Node] = field(default_factory=list)  # nodes of the cached full blocks
    cached_tokens: int = 0  # every tier, as the OpenAI usage field reports it
    external_cached_tokens: int = 0  # of which loaded from the host tier
    num_preemptions: int = 0
    #: SGLang's radix cache: the node the request references, the tokens of its sequence the
    #: tree holds (matched or inserted), the slots it holds outside the tree.
    radix_node: Any = None
    radix_inserted: int = 0
    radix_held: int = 0
    #: Output tokens the metrics have counted (vLLM counts them per step, as sampled).
    counted_output: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    decode_started: float | None = None
    finished_at: float | None = None
    finish_reason: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt)


class EngineStats:
    """What vLLM's stat loggers would record; the metrics module renders it."""

    def __init__(self) -> None:
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.prompt_tokens_cached = 0
        self.ext_queries = 0
        self.ext_hits = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.requests = 0
        self.last_batch_hit_rate = 0.0
        self.listeners: list[Callable[[str, SimRequest], None]] = []

    def emit(self, event: str, req: SimRequest) -> None:
        for listener in self.listeners:
            listener(event, req)


class Engine:
    def __init__(self, config: EngineConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.pool = BlockPool(config.num_blocks, config.block_size, config.enable_prefix_caching)
        if config.kv_cache_metrics:
            self.pool.residency = Residency(clock, config.kv_cache_metrics_sample)
        self.stats = EngineStats()
        self.offload = (HostTier(config.offload_blocks, config.block_size)
                        if config.offload_blocks else None)
        if self.offload is not None:
            self.offload.device = self.pool  # a store pins its device blocks until it completes
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.lock = threading.RLock()
        self._prefill_free_at = 0.0
        self._ids = itertools.count()
        self._answer_ids: list[int] = [1000]
        #: vLLM's KV event stream (--kv-events-port); None when off.
        self.kv_events: KVEvents | None = None

    @property
    def prefix_store(self) -> PrefixStore:
        """Where this engine caches prompts (vLLM's block pool): what attaching the KV event
        stream, a restart, a prefix-cache reset and the KV usage act on."""
        return self.pool

    def attach_kv_events(self, kv_events: KVEvents) -> None:
        """Publish the prefix store's (and the host tier's) stores and evictions, once per
        step."""
        with self.lock:
            self.kv_events = kv_events
            self.prefix_store.events = kv_events.sink
            if self.offload is not None:
                self.offload.events = kv_events.sink

    def set_answer_vocabulary(self, ids: Sequence[int]) -> None:
        self._answer_ids = list(ids) or [1000]

    # -- intake --------------------------------------------------------------------------------

    def submit(self, prompt: list[int], max_tokens: int = 16, extra_keys: Hashable = None,
               request_id: str | None = None) -> SimRequest:
        """Queue a request; raises ValueError on a prompt the model cannot take."""
        if not prompt:
            raise ValueError("the prompt is empty")
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if len(prompt) + max_tokens > self.config.max_model_len:
            raise ValueError(
                f"This model's maximum context length is {self.config.max_model_len} tokens. "
                f"However, you requested {len(prompt) + max_tokens} tokens "
                f"({len(prompt)} in the messages, {max_tokens} in the completion).")
        self._check_fits(len(prompt) + max_tokens)
        req = SimRequest(request_id or f"cmpl-{next(self._ids)}", list(prompt), max_tokens,
                         extra_keys, arrival=self.clock())
        with self.lock:
            if len(self.waiting) >= self.config.max_waiting:
                raise OverflowError("too many waiting requests")
            self.waiting.append(req)
        return req

    def _check_fits(self, tokens: int) -> None:
        """ValueError when a request of ``tokens`` could never fit the KV pool."""
        needed = math.ceil(tokens / self.config.block_size)
        if needed > self.pool.usable_blocks:
            raise ValueError(f"the request needs {needed} KV blocks; the pool has "
                             f"{self.pool.usable_blocks}")

    # -- scheduling ----------------------------------------------------------------------------

    def step(self, now: float | None = None) -> None:
        """Advance running requests to ``now``, then admit what fits."""
        now = self.clock() if now is None else now
        with self.lock:
            self._advance(now)
            self._admit(now)
            if self.offload is not None:
                self.offload.step(now)
            if self.kv_events is not None:
                self.kv_events.flush()  # one KVEventBatch per step that produced events

    def _admit(self, now: float) -> None:
        cfg = self.config
        pool = self.pool
        while self.waiting and len(self.running) < cfg.max_num_seqs:
            req = self.waiting[0]
            tokens = req.prompt + req.output  # after a preemption, the output is recomputed
            admitted = pool.admit(tokens, req.extra_keys)
            if admitted is None:
                break  # wait for running requests to free blocks
            self.waiting.popleft()
            req.blocks = admitted.blocks
            req.path = admitted.path
            hit_tokens = admitted.cached_tokens
            uncached = len(tokens) - hit_tokens
            host_tokens = 0
            if self.offload is not None:
                # The copies complete once the step that computed the prompt has ended: when
                # its first token is out (a request of one token has freed its blocks by then).
                start = max(now, self._prefill_free_at)
                host_tokens = self.offload.admit(tokens, req.extra_keys, hit_tokens, start + (
                    uncached / cfg.prefill_tokens_per_s) + cfg.base_latency, admitted.blocks)
                uncached -= host_tokens - host_tokens / LOAD_SPEEDUP
            if req.num_preemptions == 0:
                st = self.stats
                st.prefix_queries += len(tokens)
                st.prefix_hits += hit_tokens
                st.prompt_tokens += len(tokens)
                st.prompt_tokens_cached += hit_tokens + host_tokens
                if self.offload is not None:
                    st.ext_queries += len(tokens) - hit_tokens
                    st.ext_hits += host_tokens
                st.requests += 1
                st.last_batch_hit_rate = hit_tokens / len(tokens)
                req.cached_tokens = hit_tokens + host_tokens
                req.external_cached_tokens = host_tokens
                req.scheduled_at = now
            start = max(now, self._prefill_free_at)
            self._prefill_free_at = start + uncached / cfg.prefill_tokens_per_s
            if req.first_token_at is None:
                req.first_token_at = self._prefill_free_at + cfg.base_latency
                req.output.append(self._next_token(req))
            req.decode_started = self._prefill_free_at + cfg.base_latency
            self.running.append(req)
            self.stats.emit("scheduled", req)

    def _next_token(self, req: SimRequest) -> int:
        # Deterministic "greedy" output: the same prompt gives the same answer.
        seed = hash((tuple(req.prompt[-8:]), len(req.output), req.extra_keys))
        return self._answer_ids[seed % len(self._answer_ids)]

    def _advance(self, now: float) -> None:
        cfg = self.config
        pool = self.pool
        bs = cfg.block_size
        for req in list(self.running):
            if req not in self.running or req.decode_started is None:
                continue
            if now < req.decode_started:
                continue
            target = min(req.max_tokens,
                         1 + int((now - req.decode_started) / cfg.time_per_output_token))
            before = len(req.output)
            while len(req.output) < target:
                # The KV of all but the newest token is computed: grow the block table.
                computed = len(req.prompt) + len(req.output)
                if math.ceil(computed / bs) > len(req.blocks):
                    if pool.num_free == 0 and not self._preempt_for(req):
                        break
                    if req not in self.running:
                        break
                    req.blocks += pool.allocate(1)
                req.output.append(self._next_token(req))
                self._cache_full_blocks(req)
            if len(req.output) > before:
                self.stats.emit("generated", req)
            if req in self.running and len(req.output) >= req.max_tokens:
                finished = req.decode_started + (req.max_tokens - 1) * cfg.time_per_output_token
                self._finish(req, max(finished, req.first_token_at or now), "length")

    def _cache_full_blocks(self, req: SimRequest) -> None:
        """Cache blocks filled by computed tokens (all but the last sampled one)."""
        pool = self.pool
        bs = self.config.block_size
        computed = len(req.prompt) + len(req.output) - 1
        full = computed // bs
        if full <= len(req.path) or not pool.enable_caching:
            return
        tokens = req.prompt + req.output
        parent = req.path[-1] if req.path else pool.root(req.extra_keys)
        start = len(req.path)
        blocks = [tuple(tokens[i * bs:(i + 1) * bs]) for i in range(start, full)]
        req.path += pool.cache_blocks(parent, blocks, req.blocks[start:full], req.extra_keys)

    def _preempt_for(self, req: SimRequest) -> bool:
        """Free blocks by preempting the most recently scheduled request (vLLM's policy)."""
        while self.pool.num_free == 0 and self.running:
            victim = self.running.pop()
            self.pool.release(victim.blocks)
            victim.blocks = []
            victim.path = []
            victim.num_preemptions += 1
            victim.decode_started = None
            self.stats.preemptions += 1
            self.waiting.appendleft(victim)
            self.stats.emit("preempted", victim)
            if victim is req:
                return False
        return self.pool.num_free > 0

    def _finish(self, req: SimRequest, at: float, reason: str) -> None:
        self.running.remove(req)
        self._free(req)
        req.finished_at = at
        req.finish_reason = reason
        self.stats.generation_tokens += len(req.output)
        self.stats.emit("finished", req)
        req.done.set()

    def _free(self, req: SimRequest) -> None:
        """A finished request's KV: its blocks go back to the pool (cached ones stay cached)."""
        self.pool.release(req.blocks)
        req.blocks = []

    # -- operations ----------------------------------------------------------------------------

    def restart(self) -> None:
        """Simulate a server restart: empty cache, counters back to zero (new process)."""
        with self.lock:
            for req in list(self.running) + list(self.waiting):
                req.error = "server restarted"
                req.done.set()
            self.running.clear()
            self.waiting.clear()
            self.prefix_store.reset()
            if self.offload is not None:
                self.offload.reset()
            if self.kv_events is not None:
                self.kv_events.restart()  # a new process: new hash seed, sequence from 0
            self.stats = EngineStats()  # listeners of the old process go with it
            self._prefill_free_at = 0.0

    def reset_prefix_cache(self) -> bool:
        """vLLM's ``BlockPool.reset_prefix_cache``: forget every cached block (publishing
        AllBlocksCleared) when no request holds one; False, and nothing changed, otherwise.
        The counters go on (it is no restart)."""
        with self.lock:
            if self.running or self.waiting:
                return False
            self.prefix_store.reset()
            if self.kv_events is not None:
                self.kv_events.sink.cleared()
                self.kv_events.flush()
            return True

    @property
    def kv_usage(self) -> float:
        return self.prefix_store.usage()

    def run_until_idle(self, step: float = 0.01, limit: float = 3600.0) -> float:
        """Virtual time: step (advancing a VirtualClock) until idle; returns the time."""
        clock = self.clock
        if not isinstance(clock, VirtualClock):
            raise TypeError("run_until_idle needs an engine on a VirtualClock")
        end = clock.now + limit
        offload = self.offload
        while (self.waiting or self.running or (offload is not None and offload.busy)
               ) and clock.now < end:
            self.step()
            clock.now += step
        return clock.now


class VirtualClock:
    """A clock for tests and benchmarks: time moves only when told to."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class EngineThread:
    """Drives an Engine in real time."""

    def __init__(self, engine: Engine, tick: float = 0.005) -> None:
        self.engine = engine
        self.tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            self.engine.step()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
