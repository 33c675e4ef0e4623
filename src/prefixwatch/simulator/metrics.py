"""The simulator's /metrics page: vLLM 0.33's families (or SGLang's), via client_python.

Every family of the real page is declared from the catalog's copy of it (names, HELP texts,
label names, pre-initialised label values, bucket boundaries), so the page matches vLLM's line
family by line family; the families the simulator models carry real values, the others stay
at their pre-initialised zeros.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)

from prefixwatch.core.vocab import schemas
from prefixwatch.simulator import pages
from prefixwatch.simulator.engine import Engine, SimRequest


def _label_names(family: pages.PageFamily) -> list[str]:
    if family.name == pages.VLLM_CACHE_CONFIG_INFO:
        return sorted({k for k, _ in pages.VLLM_CACHE_CONFIG_DEFAULTS} | {"engine"})
    return list(family.labels) + [name for name, _ in family.preset]


def _declare(family: pages.PageFamily, registry: CollectorRegistry,
             max_model_len: int = 32768) -> Any:
    kwargs: dict[str, Any] = {"labelnames": _label_names(family), "registry": registry}
    if family.kind == "counter":
        return Counter(family.name, family.help, **kwargs)
    if family.kind == "histogram":
        buckets = family.buckets
        if family.name in pages.VLLM_MAX_MODEL_LEN_BUCKETS:
            buckets = pages.buckets_1_2_5(max_model_len)
        return Histogram(family.name, family.help, buckets=buckets, **kwargs)
    return Gauge(family.name, family.help, **kwargs)


class PageMetrics:
    """One replica's metric objects, bound to one Engine's events. Rebuilt on a restart."""

    def __init__(self, engine: Engine, server: str = "vllm", engine_index: str = "0") -> None:
        self.engine = engine
        self.server = server
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        page = pages.VLLM_V1_PAGE if server == "vllm" else pages.SGLANG_PAGE
        residency = engine.pool.residency if server == "vllm" else None
        if residency is not None:  # declared right after the decode-time histogram, as vLLM does
            at = next(i for i, f in enumerate(page)
                      if f.name == "vllm:request_decode_time_seconds") + 1
            page = page[:at] + pages.VLLM_KV_CACHE_METRICS_PAGE + page[at:]
        self.offload = engine.offload
        self._offload_seen = (0, 0, 0)  # loads, stores, evictions already counted
        if self.offload is not None:
            page = _with_host_tier(page, server)
        self.m: dict[str, Any] = {}
        #: The families labelled with the engine index.
        self._by_engine = {f.name for f in page if "engine" in _label_names(f)}
        model = engine.config.model
        for family in page:
            metric = _declare(family, self.registry, engine.config.max_model_len)
            self.m[family.name] = metric
            if family.name == pages.VLLM_CACHE_CONFIG_INFO or family.lazy:
                continue
            base = {"model_name": model}
            if "engine" in family.labels:
                base["engine"] = engine_index
            if family.preset:
                name, values = family.preset[0]
                for value in values:
                    metric.labels(**base, **{name: value})
            else:
                metric.labels(**base)
        self._base = {"model_name": model}
        self._engine_index = engine_index
        self._children: dict[tuple, Any] = {}
        if self.offload is not None and server == "vllm":
            self._l(pages.VLLM_OFFLOAD_INFO, backend="cpu", page_cache="false",
                    lazy_offload="false", capacity_blocks=str(self.offload.capacity)).set(1)
        if server == "vllm":
            self._set_cache_info()
            self.m["vllm:engine_sleep_state"].labels(
                model_name=model, engine=engine_index, sleep_state="awake").set(1)
        engine.stats.listeners.append(self.on_event)
        if residency is not None:
            residency.listeners.append(self.on_eviction)

    def _l(self, name: str, **extra: str) -> Any:
        key = (name, *extra.items())
        child = self._children.get(key)
        if child is None:
            labels = dict(self._base)
            if name in self._by_engine:
                labels["engine"] = self._engine_index
            labels.update(extra)
            child = self._children[key] = self.m[name].labels(**labels)
        return child

    def _set_cache_info(self) -> None:
        cfg = self.engine.config
        values = dict(pages.VLLM_CACHE_CONFIG_DEFAULTS)
        values[schemas.CACHE_INFO_BLOCK_SIZE] = str(cfg.block_size)
        values[schemas.CACHE_INFO_NUM_GPU_BLOCKS] = str(cfg.num_blocks)
        values[schemas.CACHE_INFO_ENABLED] = str(cfg.enable_prefix_caching)
        values["engine"] = self._engine_index
        if self.offload is not None:
            values["simple_cpu_offload_num_blocks"] = str(self.offload.capacity)
        self.m[pages.VLLM_CACHE_CONFIG_INFO].labels(**values).set(1)

    # -- events from the engine ----------------------------------------------------------------

    def on_event(self, event: str, req: SimRequest) -> None:
        if self.server == "vllm":
            self._vllm_event(event, req)
        else:
            self._sglang_event(event, req)

    def _generated(self, req: SimRequest, family: str) -> None:
        """The output tokens sampled since the last count (vLLM counts them per step)."""
        new = len(req.output) - req.counted_output
        if new > 0:
            self._l(family).inc(new)
            req.counted_output = len(req.output)

    def _vllm_event(self, event: str, req: SimRequest) -> None:
        self._generated(req, "vllm:generation_tokens")
        if event == "preempted":
            self._l("vllm:num_preemptions").inc()
            return
        if event == "scheduled" and req.num_preemptions == 0:
            n, ext = req.num_prompt_tokens, req.external_cached_tokens
            hit = req.cached_tokens - ext  # the device tier's part
            self._l("vllm:prefix_cache_queries").inc(n)
            self._l("vllm:prefix_cache_hits").inc(hit)
            self._l("vllm:prompt_tokens").inc(n)
            self._l("vllm:prompt_tokens_cached").inc(hit + ext)
            self._l("vllm:prompt_tokens_by_source", source="local_compute").inc(n - hit - ext)
            self._l("vllm:prompt_tokens_by_source", source="local_cache_hit").inc(hit)
            self._l("vllm:prompt_tokens_cached_by_source", source="device").inc(hit)
            if self.offload is not None:  # a KV connector: external queries are device misses
                self._l("vllm:external_prefix_cache_queries").inc(n - hit)
                self._l("vllm:external_prefix_cache_hits").inc(ext)
                self._l("vllm:prompt_tokens_by_source", source="external_kv_transfer").inc(ext)
                self._l("vllm:prompt_tokens_cached_by_source", source="host").inc(ext)
            self._l("vllm:iteration_tokens_total").observe(n - hit - ext)
            if req.first_token_at is not None:
                self._l("vllm:time_to_first_token_seconds").observe(
                    req.first_token_at - req.arrival)
            if req.scheduled_at is not None:
                self._l("vllm:request_queue_time_seconds").observe(
                    req.scheduled_at - req.arrival)
        elif event == "finished":
            out = len(req.output)
            # Observed when the request finishes, as vLLM's FinishedRequestStats are.
            self._l("vllm:request_prompt_tokens").observe(req.num_prompt_tokens)
            self._l("vllm:request_prefill_kv_computed_tokens").observe(
                req.num_prompt_tokens - req.cached_tokens)
            self._l("vllm:request_success", finished_reason=req.finish_reason or "length").inc()
            self._l("vllm:request_generation_tokens").observe(out)
            self._l("vllm:request_max_num_generation_tokens").observe(req.max_tokens)
            self._l("vllm:request_params_max_tokens").observe(req.max_tokens)
            self._l("vllm:request_params_n").observe(1)
            self._l("vllm:request_num_preemptions").observe(req.num_preemptions)
            end = req.finished_at or 0.0
            self._l("vllm:e2e_request_latency_seconds").observe(end - req.arrival)
            if req.scheduled_at is not None and req.first_token_at is not None:
                self._l("vllm:request_inference_time_seconds").observe(end - req.scheduled_at)
                self._l("vllm:request_prefill_time_seconds").observe(
                    req.first_token_at - req.scheduled_at)
                self._l("vllm:request_decode_time_seconds").observe(end - req.first_token_at)
                if out > 1:
                    tpot = (end - req.first_token_at) / (out - 1)
                    self._l("vllm:request_time_per_output_token_seconds").observe(tpot)
                    self._l("vllm:inter_token_latency_seconds").observe(tpot)

    def on_eviction(self, lifetime: float, idle: float, gaps: list[float]) -> None:
        """A sampled block's cached content was evicted (vLLM's --kv-cache-metrics)."""
        self._l("vllm:kv_block_lifetime_seconds").observe(lifetime)
        self._l("vllm:kv_block_idle_before_evict_seconds").observe(idle)
        for gap in gaps:
            self._l("vllm:kv_block_reuse_gap_seconds").observe(gap)

    def _sglang_event(self, event: str, req: SimRequest) -> None:
        """SGLang's scheduler sets the hit-rate gauge per prefill batch; its tokenizer manager
        counts a request's prompt, generated and cached tokens (by source, a source only when
        it served some) when the request finishes."""
        if event == "scheduled" and req.num_preemptions == 0:
            self._l("sglang:cache_hit_rate").set(self.engine.stats.last_batch_hit_rate)
            if req.first_token_at is not None:
                self._l("sglang:time_to_first_token_seconds").observe(
                    req.first_token_at - req.arrival)
        elif event == "finished":
            self._l("sglang:prompt_tokens").inc(req.num_prompt_tokens)
            self._l("sglang:generation_tokens").inc(len(req.output))
            req.counted_output = len(req.output)
            device = req.cached_tokens - req.external_cached_tokens
            if device > 0:
                self._l("sglang:cached_tokens", cache_source="device").inc(device)
            if req.external_cached_tokens > 0:
                self._l("sglang:cached_tokens", cache_source="host").inc(
                    req.external_cached_tokens)
            self._l("sglang:num_requests").inc()

    # -- the page ------------------------------------------------------------------------------

    def refresh_gauges(self) -> None:
        eng = self.engine
        with eng.lock:
            running, waiting, usage = len(eng.running), len(eng.waiting), eng.kv_usage
        if self.server == "vllm":
            self._l("vllm:num_requests_running").set(running)
            self._l("vllm:num_requests_waiting").set(waiting)
            self._l("vllm:num_requests_waiting_by_reason", reason="capacity").set(waiting)
            self._l("vllm:kv_cache_usage_perc").set(usage)
        else:
            self._l("sglang:num_running_reqs").set(running)
            self._l("sglang:num_queue_reqs").set(waiting)
            self._l("sglang:token_usage").set(round(usage, 2))  # SGLang rounds it
        if self.offload is not None:
            self._refresh_host_tier()

    def _refresh_host_tier(self) -> None:
        """The host tier's gauges, and its counters brought up to the tier's own counts."""
        eng, tier = self.engine, self.offload
        assert tier is not None
        with eng.lock:
            loads, stores, evicted = tier.load_blocks, tier.stored_blocks, eng.pool.evictions
            used, pending, held = tier.used_blocks, tier.pending_store_blocks, tier.held_blocks
            cache = getattr(eng, "cache", None)  # SGLang's radix cache counts in tokens
            if cache is not None:
                evicted = cache.evicted_tokens // tier.block_size
        seen_loads, seen_stores, seen_evicted = self._offload_seen
        self._offload_seen = (loads, stores, evicted)
        bs = tier.block_size
        if self.server == "vllm":
            if loads > seen_loads:
                self._l("vllm:simple_kv_offload_load_blocks").inc(loads - seen_loads)
            self._l("vllm:simple_kv_offload_used_blocks").set(used)
            self._l("vllm:simple_kv_offload_pending_store_blocks").set(pending)
            return
        sched = dict(pages.SGLANG_SCHEDULER_LABELS)
        self._l("sglang:hicache_host_used_tokens", **sched).set(held * bs)
        self._l("sglang:hicache_host_total_tokens", **sched).set(tier.capacity * bs)
        for name, now, before, extra in (
                ("sglang:load_back_tokens", loads, seen_loads, {"pool": "kv"}),
                ("sglang:hicache_backup_tokens", stores, seen_stores, {"pool": "kv"}),
                ("sglang:evicted_tokens", evicted, seen_evicted, {})):
            if now > before:
                self._l(name, **sched, **extra).inc((now - before) * bs)

    def render(self) -> bytes:
        self.refresh_gauges()
        return generate_latest(self.registry)


def _with_host_tier(page: tuple[pages.PageFamily, ...], server: str
                    ) -> tuple[pages.PageFamily, ...]:
    """The page with a host tier's families where the engine registers them."""
    if server != "vllm":
        return page + pages.SGLANG_HICACHE_PAGE
    at = next(i for i, f in enumerate(page) if f.name == pages.VLLM_KV_CONNECTOR_AFTER) + 1
    return (pages.VLLM_SIMPLE_OFFLOAD_PAGE + page[:at] + pages.VLLM_KV_CONNECTOR_PAGE
            + page[at:])
