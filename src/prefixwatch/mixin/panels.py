"""The dashboards' panels: PromQL and texts for one source, one config and one scope (all
replicas, or one). Every threshold, selector and text comes from the MixinConfig; a panel whose
series the source lacks (SGLang has no external cache, no prompt-length histogram) is left out.

The helpers every panel shares are panelbase.py's.
"""

from __future__ import annotations

from grafanalib import core as g

from prefixwatch.core.vocab import exposition
from prefixwatch.core.vocab.rulenames import (
    ALERT_LOW,
    ALERT_PATTERN,
    MODEL,
    MODEL_PART,
    MODEL_TARGET_PART,
    MODEL_TIER,
    R_ACHIEVABLE,
    R_LEDGER_SHARE,
    R_MISSED,
    R_SAVED_SHARE,
    R_TTFT,
    r_cached,
    r_hits,
    r_kv_computed_share,
    r_prompt,
    r_ratio,
    r_recomputed,
    r_router_believed,
    r_router_delivered,
)
from prefixwatch.mixin.panelbase import PanelBase
from prefixwatch.mixin.promql import DASHBOARD_WINDOW, tier_rates

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


class Panels(PanelBase):
    """One method per panel, each mostly its on-call text."""

    def hit_rate_now(self, w: int = 6, h: int = 5) -> None:
        expr = self.ratio("model_name") if self.one else self.recorded(r_ratio(MODEL, "5m"))
        self.add(g.Stat(
            title="Hit rate now (5m)",
            description=f"Share of prompt tokens served from the prefix cache over the last 5 "
                        f"minutes, per model (sum of hits over sum of queries, all replicas). "
                        f"Red below {self.thr:.0%}{self.threshold_note()}, where {ALERT_LOW} "
                        f"fires. Empty means no traffic, not a broken cache.",
            targets=[self.target(expr, "{{model_name}}", "A")],
            format="percentunit", decimals=1, reduceCalc="lastNotNull", graphMode="area",
            noValue="no traffic", thresholds=self.hit_thresholds()), w, h)

    def ttft_now(self, w: int = 6, h: int = 5) -> None:
        quantiles = (("0.5", "50", "A"), ("0.95", "95", "B"))
        ttft = self.s.ttft
        assert ttft
        targets = [self.target(self.quantile(q, ttft) if self.one
                               else self.recorded(R_TTFT, f'quantile="{q}"'),
                               f"p{p} {{{{model_name}}}}", ref) for q, p, ref in quantiles]
        self.add(g.Stat(
            title="TTFT p50 / p95 (5m)",
            description="Time to first token. When the hit rate falls, TTFT rises: prompts "
                        "are prefilled from scratch. If the hit rate fell and TTFT did not "
                        "move, the cache was not helping where the traffic goes.",
            targets=targets, format="s", decimals=2, reduceCalc="lastNotNull",
            thresholds=[g.Threshold("green", 0, 0.0), g.Threshold("orange", 1, 1.0)]), w, h)

    def tokens_saved(self, w: int = 6, h: int = 5) -> None:
        self.add(g.Stat(
            title="Prefill tokens saved per second",
            description="Prompt tokens per second served from the prefix cache instead of "
                        "being prefilled: the GPU work the cache saves right now.",
            targets=[self.target(f"sum ({self.hits_rate()})", "tokens/s", "A")],
            format="short", decimals=0, reduceCalc="lastNotNull",
            thresholds=[g.Threshold("blue", 0, 0.0)]), w, h)

    def firing_alerts(self, w: int = 6, h: int = 5) -> None:
        cluster = (f',{self.cfg.cluster_label}=~"$cluster"' if self.cfg.cluster_label else "")
        expr = (f'count(ALERTS{{alertstate="firing",alertname=~"{ALERT_PATTERN}"{cluster}}}) '
                "or vector(0)")
        self.add(g.Stat(
            title="Firing prefix-cache alerts",
            description="PrefixCache* alerts firing now (see the runbook link above). 0 is "
                        "good; the Watchdog is not counted.",
            targets=[self.target(expr, "firing", "A")], format="short", decimals=0,
            reduceCalc="lastNotNull", graphMode="none",
            thresholds=[g.Threshold("green", 0, 0.0), g.Threshold("red", 1, 1.0)]), w, h)

    def hit_rate_over_time(self, w: int = 12, h: int = 8) -> None:
        self.add(g.TimeSeries(
            title="Hit rate over time",
            description=f"Prefix-cache hit rate per model, with the {self.thr:.0%} alert "
                        f"threshold drawn{self.threshold_note()}. A cliff is a deploy (a prompt "
                        "that now changes near the top); a slope is a drift (more distinct "
                        "prefixes, a fuller pool).",
            targets=[self.target(self.ratio("model_name"), "{{model_name}}", "A")],
            unit="percentunit", valueMin=0, valueMax=1, thresholdsStyleMode="line",
            thresholds=self.hit_thresholds()), w, h)

    def hit_rate_vs_ttft(self, w: int = 12, h: int = 8) -> None:
        assert self.s.ttft
        overrides = self.right_axis("TTFT.*", "s", ("min", 0))
        self.add(g.TimeSeries(
            title="Hit rate and TTFT",
            description="Hit rate (left axis) against TTFT p50/p95 (right axis). They should "
                        "mirror each other: when the hit rate falls, TTFT rises. If the hit "
                        "rate moves and TTFT does not, the cache or the routing is "
                        "misconfigured.",
            targets=[self.target(self.ratio("model_name"), "hit rate {{model_name}}", "A"),
                     self.target(self.quantile("0.5", self.s.ttft),
                                 "TTFT p50 {{model_name}}", "B"),
                     self.target(self.quantile("0.95", self.s.ttft),
                                 "TTFT p95 {{model_name}}", "C")],
            unit="percentunit", valueMin=0, overrides=overrides), w, h)

    def tier_share(self, w: int = 12, h: int = 8) -> None:
        """Stacked share of prompt tokens by the tier that served them, and recomputed."""
        t = self.s.tiers
        if t is None:
            return
        if self.one:
            tiers = tier_rates(t, lambda m, x: self.rate(m, x), lambda e: f"sum by (tier) ({e})",
                               "")
            total = f"sum ({self.rate(t.total)})"
            recomputed = f"clamp_min({total} - sum ({tiers}), 0)"
        else:
            tiers = f"sum by (tier) ({self.recorded(r_cached(MODEL_TIER, '5m'))})"
            total = f"sum ({self.recorded(r_prompt(MODEL, '5m'))})"
            recomputed = f"sum ({self.recorded(r_recomputed(MODEL, '5m'))})"
        self.add(g.TimeSeries(
            title="Prompt tokens by cache tier",
            description="Share of prompt tokens served by each cache tier (device = HBM, host = "
                        "CPU offload or HiCache, disk, remote, unknown = a connector that does "
                        "not say) and recomputed, stacked to 100%. The effective hit rate is "
                        "everything but recomputed; the device band alone is the device hit "
                        f"rate. The hit-rate alerts judge the {self.cfg.hit_ratio} one. A "
                        "shrinking device band over a steady total: the working set outgrew "
                        "HBM and TTFT pays the loads (PrefixCacheDeviceShareLow); a fed tier "
                        "with no band: PrefixCacheTierIdle.",
            targets=[self.target(f"({tiers})\n/ ignoring (tier) group_left ()\n({total} > 0)",
                                 "{{tier}}", "A"),
                     self.target(f"{recomputed}\n/\n({total} > 0)", "recomputed", "B")],
            unit="percentunit", valueMin=0, valueMax=1,
            stacking={"mode": "normal", "group": "A"}, fillOpacity=50), w, h)

    def why_computed(self, w: int = 12, h: int = 8) -> None:
        """The exporter's KV event ledger: computed prompt tokens by why, stacked to 100%."""
        if self.s.name != "exporter":
            return
        if self.one:
            expr = self.recorded(r_kv_computed_share(MODEL_TARGET_PART, DASHBOARD_WINDOW),
                                 'target=~"$instance"')
            legend = "{{part}}"
        else:
            expr = self.recorded(r_kv_computed_share(MODEL_PART, DASHBOARD_WINDOW))
            legend = "{{model_name}} {{part}}"
        self.add(g.TimeSeries(
            title="Why these tokens were computed",
            description="Prompt tokens the device prefilled (not served by any cache tier), "
                        "by why, stacked to 100%, from the engines' KV event streams (the "
                        "exporter's `kv_events:` per target; vLLM's --kv-events-config): "
                        "eviction (this replica held the blocks and evicted them: a larger "
                        "pool or a host tier), routing (another replica held them: "
                        "prefix-aware routing), layout (the same text after a short "
                        "divergence near the top: move the varying part down), novel (no "
                        "replica ever held it, the blocks of generated answers included: "
                        f"nothing to win) and {exposition.LEDGER_TAIL} (each request's last "
                        "partial block, never cacheable). Tokens a "
                        "lower tier loaded are not computed and not here. "
                        f"{self.cfg.runbook('kv-events-why-tokens-were-computed')}",
            targets=[self.target(expr, legend, "A")],
            unit="percentunit", valueMin=0, valueMax=1,
            stacking={"mode": "normal", "group": "A"}, fillOpacity=50), w, h)

    def router_belief(self, w: int = 12, h: int = 8) -> None:
        """Each router's predicted hit share beside what its engines delivered."""
        if self.s.name != "exporter":
            return
        scope = self.matchers(model=False, raw=False)
        wd = DASHBOARD_WINDOW
        self.add(g.TimeSeries(
            title="Routers: believed vs delivered",
            description="Per router (an exporter target of kind router): the share of its "
                        "requests it predicted a prefix hit for, as the router counts it "
                        "(lookups that hit its index, tree matches, predicted match ratios), "
                        "beside the prefix-cache hit ratio the engines it routes to delivered "
                        "(their own counters, in tokens). A router that believes far more than "
                        "is delivered routes by a stale index (PrefixCacheRouterIndexStale). "
                        f"{self.cfg.runbook('prefixcacherouterindexstale')}",
            targets=[self.target(r_router_believed(wd) + scope, "{{router}} believed", "A"),
                     self.target(r_router_delivered(wd) + scope, "{{router}} delivered", "B")],
            unit="percentunit", valueMin=0, valueMax=1), w, h)

    def router_decisions(self, w: int = 12, h: int = 8) -> None:
        """Requests each router sent to each worker, and the routing part of the ledger."""
        if self.s.name != "exporter":
            return
        scope = self.matchers(model=False)
        sent = (f"sum by (router, worker) (rate("
                f"{exposition.OUT_ROUTER_WORKER_REQUESTS.name}_total{scope}[$__rate_interval]))")
        routing = self.recorded(r_kv_computed_share(MODEL_PART, DASHBOARD_WINDOW),
                                'part="routing"')
        self.add(g.TimeSeries(
            title="Routers: requests per worker, and the routing part",
            description="Requests per second each router sent to each worker (left), and "
                        "the share of the computed prompt tokens that another replica held "
                        "(right: the KV event ledger's routing part, per model). Round-robin "
                        "spreads a prefix over every worker and the routing part rises; a "
                        "prefix-aware policy keeps it near zero.",
            targets=[self.target(sent, "{{router}} -> {{worker}}", "A"),
                     self.target(routing, "routing part {{model_name}}", "B")],
            unit="reqps", overrides=self.right_axis("routing part.*", "percentunit")), w, h)

    def cached_vs_computed(self, w: int = 12, h: int = 8) -> None:
        cached = f"sum ({self.hits_rate()})"
        computed = f"sum ({self.rate(self.s.queries)})\n-\nsum ({self.hits_rate()})"
        self.add(g.TimeSeries(
            title="Prompt tokens: cached vs computed",
            description="Prompt tokens per second served from cache (saved) and prefilled "
                        "(computed), stacked: the top of the stack is the prompt load. A "
                        "growing computed band at the same load is a falling hit rate.",
            targets=[self.target(cached, "cached", "A"), self.target(computed, "computed", "B")],
            unit="short", stacking={"mode": "normal", "group": "A"}, fillOpacity=40), w, h)

    def per_replica(self, w: int = 12, h: int = 8) -> None:
        replica = self.s.replica_label
        self.add(g.TimeSeries(
            title="Hit rate per replica",
            description="Each replica's hit rate. One far below its peers points at routing "
                        "(round-robin spreads each prefix over every replica) or at eviction "
                        "on that node; see PrefixCacheReplicaOutlier.",
            targets=[self.target(self.ratio(f"model_name, {replica}"),
                                 f"{{{{{replica}}}}} {{{{model_name}}}}", "A")],
            unit="percentunit", valueMin=0, valueMax=1, thresholdsStyleMode="line",
            thresholds=self.hit_thresholds()), w, h)

    def kv_and_pressure(self, w: int = 12, h: int = 8) -> None:
        """KV usage with preemptions (vLLM) or, without them (SGLang), the queue."""
        s, replica = self.s, self.s.replica_label
        if not s.kv_usage:
            return
        second, label = (s.preemptions, "preemptions") if s.preemptions else (s.waiting,
                                                                             "waiting")
        assert second
        per_second = (f"sum by ({replica}) ({self.rate(second)})" if s.preemptions
                      else f"sum by ({replica}) ({self.sel(second)})")
        overrides = self.right_axis(f"{label}.*", "short", ("custom.drawStyle", "bars"))
        what = ("preemptions per second" if s.preemptions else "requests waiting")
        self.add(g.TimeSeries(
            title="KV-cache usage and preemptions" if s.preemptions
            else "KV-cache usage and waiting requests",
            description=f"KV-cache pool usage per replica (left) and {what} (right). Usage "
                        f"near 100% with {label} means cached prefixes are evicted before "
                        "reuse: see PrefixCacheEvictionPressure.",
            targets=[self.target(f"max by ({replica}) ({self.sel(s.kv_usage)})",
                                 f"usage {{{{{replica}}}}}", "A"),
                     self.target(per_second, f"{label} {{{{{replica}}}}}", "B")],
            unit="percentunit", valueMin=0, overrides=overrides), w, h)

    def prompt_length(self, w: int = 12, h: int = 8) -> None:
        if not self.s.prompt_len:
            return
        unit = (f"one page ({self.cfg.page_size} tokens)" if self.s.engine == "sglang"
                else f"one block ({self.cfg.block_size} tokens)")
        self.add(g.TimeSeries(
            title="Prompt length p50 vs p99",
            description=f"Prompt tokens per request. Prompts under {unit} can never hit; a "
                        "p99 far above the p50 means prompts share little, so the cache cannot "
                        "help much.",
            targets=[self.target(self.quantile("0.5", self.s.prompt_len),
                                 "p50 {{model_name}}", "A"),
                     self.target(self.quantile("0.99", self.s.prompt_len),
                                 "p99 {{model_name}}", "B")],
            unit="short"), w, h)

    def external_cache(self, w: int = 12, h: int = 8) -> None:
        if not (self.s.ext_hits and self.s.ext_queries):
            return
        ratio = (f"sum ({self.rate(self.s.ext_hits)})\n/\n"
                 f"(sum ({self.rate(self.s.ext_queries)}) > 0)")
        overrides = self.right_axis("external queries", "short", by="byName")
        self.add(g.TimeSeries(
            title="External (KV connector) cache",
            description="Hit rate of an external KV cache (LMCache, NIXL, ... through vLLM's "
                        "KV connector) and the tokens per second looked up there. Without a "
                        "connector the lookups stay at 0 and there is no hit rate to show.",
            targets=[self.target(ratio, "external hit rate", "A"),
                     self.target(f"sum ({self.rate(self.s.ext_queries)})", "external queries",
                                 "B")],
            unit="percentunit", valueMin=0, overrides=overrides), w, h)

    def requests(self, w: int = 12, h: int = 8) -> None:
        assert self.s.running and self.s.waiting
        self.add(g.TimeSeries(
            title="Requests running and waiting",
            description="Requests in the running batch and in the queue. A queue that grows "
                        "while the hit rate falls is prefill work the cache no longer saves.",
            targets=[self.target(f"sum ({self.sel(self.s.running)})", "running", "A"),
                     self.target(f"sum ({self.sel(self.s.waiting)})", "waiting", "B")],
            unit="short"), w, h)

    def why_low(self, w: int = 12, h: int = 8) -> None:
        diag = exposition.OUT_DIAGNOSIS.name + self.matchers(replica="")
        self.add(g.StateTimeline(
            title="Why is it low?",
            description="The exporter's diagnosis: each cause of a low hit rate, red while it "
                        "holds on any replica of the selected models (prefixwatch_diagnosis). "
                        "prefix_divergence and routing_spread need the exporter's "
                        "--requests-log. Every cause has a runbook section: "
                        f"{self.cfg.runbook('diagnosis')}",
            targets=[self.target(f"max by (cause) ({diag})", "{{cause}}", "A")],
            mappings=[{"type": "value", "options": {
                "0": {"text": "no", "color": "green", "index": 0},
                "1": {"text": "yes", "color": "red", "index": 1}}}],
            thresholds=[g.Threshold("green", 0, 0.0), g.Threshold("red", 1, 1.0)],
            showValue="never", mergeValues=True), w, h)

    def achievable_vs_achieved(self, w: int = 12, h: int = 8) -> None:
        self.add(g.TimeSeries(
            title="Achievable vs achieved hit rate",
            description="Achieved: the fleet's hit rate (5m). Achievable: what an unlimited "
                        "cache would have served of the same requests (the exporter's "
                        "--requests-log, vLLM's caching rule). Both low: the prompts differ "
                        "near the top (prefix_divergence; run `prefixwatch audit`). Achievable "
                        "high, achieved low: the cache forgot (eviction_pressure) or the "
                        "traffic is spread over replicas (routing_spread).",
            targets=[self.target(self.recorded(r_ratio(MODEL, "5m")), "achieved {{model_name}}",
                                 "A"),
                     self.target(self.recorded(R_ACHIEVABLE), "achievable {{model_name}}", "B")],
            unit="percentunit", valueMin=0, valueMax=1, thresholdsStyleMode="line",
            thresholds=self.hit_thresholds()), w, h)

    def where_misses_go(self, w: int = 12, h: int = 8) -> None:
        """The ledger's shares per model as bars, TTFT beside them on the right axis."""
        assert self.s.ttft
        missed = self.recorded(R_LEDGER_SHARE, 'part!="achieved"')
        overrides = self.right_axis("TTFT.*", "s", ("min", 0), ("custom.drawStyle", "line"),
                                    ("custom.stacking", {"mode": "none", "group": "B"}))
        self.add(g.TimeSeries(
            title="Where the misses go",
            description="The hit-rate ledger (5m, needs the exporter's --requests-log or a "
                        "KV event stream): the "
                        "missed prompt tokens of each model as stacked shares, with the hit "
                        "rate they leave: novel (no earlier request shares it: nothing to "
                        "win), layout (a varying span near the top: move it down), routing "
                        "(cached on another replica: prefix-aware routing), eviction (the pool "
                        "lost it: a larger pool or a host tier), tail (from KV events: each "
                        "request's last partial block), unexplained (the engines' "
                        "cached tokens against the replay, signed). TTFT p50 on the right "
                        f"axis. {self.cfg.runbook('the-hit-rate-ledger')}",
            targets=[self.target(missed, "{{model_name}} {{part}}", "A"),
                     self.target(self.recorded(R_TTFT, 'quantile="0.5"'),
                                 "TTFT p50 {{model_name}}", "B")],
            unit="percentunit", valueMin=0, drawStyle="bars", fillOpacity=60,
            stacking={"mode": "normal", "group": "A"}, overrides=overrides), w, h)

    def capacity(self, w: int = 12, h: int = 8) -> None:
        overrides = self.right_axis("share saved.*", "percentunit", ("min", 0), ("max", 1))
        self.add(g.TimeSeries(
            title="Capacity: prefill served by cache, and what more was achievable",
            description="Arithmetic you can check (5m rates, recording rules in "
                        "alerts/): served = Δhits/Δt, prompt tokens per second the prefix "
                        "cache served instead of prefilling; recomputable = (achievable − "
                        "achieved) × Δqueries/Δt, prefill tokens per second recomputed that an "
                        "unlimited cache would have served (needs --requests-log); share saved "
                        "= Δcached prompt tokens / Δprompt tokens (right axis), the share of "
                        "prefill work the caches saved. Divide tokens/s by one GPU's prefill "
                        "throughput for GPUs' worth of prefill.",
            targets=[self.target(self.recorded(r_hits(MODEL, "5m")),
                                 "served from cache {{model_name}}", "A"),
                     self.target(self.recorded(R_MISSED), "recomputable {{model_name}}", "B"),
                     self.target(self.recorded(R_SAVED_SHARE), "share saved {{model_name}}",
                                 "C")],
            unit="short", valueMin=0, overrides=overrides), w, h)

    def scrape_health(self, w: int = 12, h: int = 8) -> None:
        if self.s.target_up and self.s.scrape_errors:
            scope = self.matchers(model=False)
            targets = [
                self.target(f"{self.s.target_up}{scope}", "up {{target}}", "A"),
                self.target(f"sum by (reason) (rate({self.s.scrape_errors}{scope}"
                            "[$__rate_interval]))", "errors: {{reason}}", "B")]
            text = ("Whether the exporter can read each vLLM target (1 = up), and why not when "
                    "it cannot (connect, timeout, http_status, parse, ...). Without data here "
                    "the other panels and the alerts are blind: see PrefixCacheMetricsAbsent.")
        else:
            scope = self.matchers(model=False, replica="instance")
            targets = [self.target(f"up{scope}", "up {{instance}}", "A"),
                       self.target(f"scrape_duration_seconds{scope}",
                                   "scrape seconds {{instance}}", "B")]
            text = (f"Whether Prometheus can scrape each {ENGINE_NAMES[self.s.engine]} server "
                    "(1 = up) and how long a scrape takes. Without data here the other panels "
                    "and the alerts are blind: see PrefixCacheMetricsAbsent.")
        self.add(g.TimeSeries(title="Targets up and scrape errors", description=text,
                              targets=targets, unit="short", valueMin=0), w, h)
