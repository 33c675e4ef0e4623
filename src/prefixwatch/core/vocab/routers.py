"""What prefixwatch reads from a router's page: each router kind, its samples and their labels.

A router decides which replica serves a request; the engines then deliver (or not) the prefix
hit it counted on. Each router exports its own *belief* in its own words: lookups that hit its
index (vllm-router's ``kv_aware``), tree matches (vllm-router's and smg's ``cache_aware``), a
histogram of predicted match ratios (smg, llm-d, Dynamo). A ``RouterSchema`` says, for one
router kind, which sample carries the requests it sent each worker, its decisions by policy,
its predictions (as hits over lookups), and the health of its own KV event feed, and by which
labels. The family table (core/vocab/families.py) holds each kind's first sample of a role; the
names are those the routers' own source and pages use (vllm-router 0.1.17 and smg 1.13.0
from pages their binaries wrote, tests/fixtures/routers/; llm-d, Dynamo and production-stack
from their source).
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixwatch.core.vocab import families


@dataclass(frozen=True)
class Prediction:
    """One way a router counts what it predicted.

    A counter whose ``label`` says hit or miss (``hit`` and ``miss`` values; any other value
    is a newer release's and is not used), or a histogram of predicted matched shares
    (``histogram``: its sum is the predicted hits, its count the predictions)."""

    sample: str
    label: str = ""
    hit: tuple[str, ...] = ()
    miss: tuple[str, ...] = ()
    histogram: bool = False
    #: A counter without a label: ``sample`` counts hits and this one misses.
    misses_sample: str = ""

    @property
    def source(self) -> str:
        """The value of the ``source`` label: the router sample read."""
        return self.sample


@dataclass(frozen=True)
class FeedProblem:
    """A counter of the router's KV event feed, and the problem it names."""

    sample: str
    problem: str


@dataclass(frozen=True)
class RouterSchema:
    """One router kind: how its page is recognised and what is read from it, by which label."""

    kind: str
    #: A page is this router's when a sample name starts with one of these.
    prefixes: tuple[str, ...]
    #: The label naming the worker (a URL) on per-worker samples.
    worker_label: str = "worker"
    #: Requests sent to each worker (summed over the sample's other labels).
    worker_requests: str = ""
    #: A gauge with one sample per worker the router knows, traffic or not.
    worker_list: str = ""
    #: (sample, policy label) of its decision counters; a policy's decisions are the largest
    #: of the samples that count it (vllm-router counts cache_aware in two of them).
    decisions: tuple[tuple[str, str], ...] = ()
    predictions: tuple[Prediction, ...] = ()
    feed: tuple[FeedProblem, ...] = ()
    note: str = ""

    def sample_names(self) -> frozenset[str]:
        """Every sample name read (histograms by their _sum and _count)."""
        out = {n for n in (self.worker_requests, self.worker_list) if n}
        out |= {s for s, _ in self.decisions}
        for p in self.predictions:
            if p.histogram:
                out |= {p.sample + "_sum", p.sample + "_count"}
            else:
                out |= {p.sample} | ({p.misses_sample} if p.misses_sample else set())
        out |= {f.sample for f in self.feed}
        return frozenset(out)


def _row(role: str, kind: str) -> str:
    return families.read(role, kind)


VLLM_ROUTER = RouterSchema(
    kind=families.VLLM_ROUTER,
    prefixes=("vllm_router_",),
    # Every request sent counts one outcome (success or failure) of the worker's breaker;
    # vllm_router_processed_requests_total is not counted under kv_aware.
    worker_requests=_row("router_worker_requests", families.VLLM_ROUTER),
    worker_list="vllm_router_worker_health",
    decisions=((_row("router_decisions", families.VLLM_ROUTER), "policy"),
               ("vllm_router_prefix_routing_decisions_total", "policy")),
    predictions=(
        # kv_aware: a lookup of the request's block hashes in the index fed by KV events;
        # missing_tokens: it had no token ids to look up (it routed blind), a predicted miss.
        Prediction(_row("router_predicted_hits", families.VLLM_ROUTER), "result", ("hit",),
                   ("miss", "missing_tokens")),
        # cache_aware: the approximate text tree matched above --cache-threshold, or not.
        Prediction("vllm_router_prefix_routing_decisions_total", "outcome", ("prefix_hit",),
                   ("prefix_miss",)),
        # Releases before the decision counter: the same tree, unlabelled.
        Prediction("vllm_router_cache_hits_total", misses_sample="vllm_router_cache_misses_total"),
    ),
    note="vllm-router exports no health of its KV event feed (0.1.17)",
)

SMG = RouterSchema(
    kind=families.SMG,
    prefixes=("smg_",),
    worker_requests=_row("router_worker_requests", families.SMG),
    worker_list="smg_worker_health",
    decisions=((_row("router_decisions", families.SMG), "policy"),),
    predictions=(Prediction(_row("router_predicted_hits", families.SMG), histogram=True),),
    feed=(FeedProblem(_row("router_kv_feed_problems", families.SMG), "gap"),
          FeedProblem("smg_kv_event_resyncs_total", "resync"),
          FeedProblem("smg_kv_event_missed_batches_total", "missed_batches"),
          FeedProblem("smg_kv_event_subscription_failures_total", "subscription_failure"),
          FeedProblem("smg_kv_event_stream_errors_total", "stream_error")),
    note="smg_engine_cache_hit_rate is not read: it stays 0 for HTTP workers",
)

LLM_D = RouterSchema(
    kind=families.LLM_D,
    prefixes=("llm_d_epp_", "llm_d_router_epp_"),
    worker_label="pod",
    predictions=(Prediction(_row("router_predicted_hits", families.LLM_D), histogram=True),),
    note="the approximate prefix index's hit ratio per scored request; the precise index's "
         "lookup_hits_total counts blocks per lookup, not a ratio",
)

DYNAMO = RouterSchema(
    kind=families.DYNAMO,
    prefixes=("dynamo_component_router_", "dynamo_frontend_"),
    worker_label="worker_id",
    predictions=(Prediction(_row("router_predicted_hits", families.DYNAMO), histogram=True),),
    note="the KV router's predicted overlap over input blocks per request",
)

PRODUCTION_STACK = RouterSchema(
    kind=families.PRODUCTION_STACK,
    prefixes=("vllm:routing_decisions_total", "vllm:num_incoming_requests"),
    worker_label="server",
    decisions=((_row("router_decisions", families.PRODUCTION_STACK), "algorithm"),),
    note="its vllm:gpu_prefix_cache_* gauges re-export the engines' deprecated names (zero on "
         "current vLLM): not read",
)

#: Checked in this order: the first kind one of whose prefixes starts a sample line wins
#: (production-stack before the engines, whose vllm: names it re-exports).
ROUTERS: tuple[RouterSchema, ...] = (VLLM_ROUTER, SMG, LLM_D, DYNAMO, PRODUCTION_STACK)
BY_KIND: dict[str, RouterSchema] = {r.kind: r for r in ROUTERS}


def detect(text: str) -> RouterSchema | None:
    """The router kind whose sample starts a line of ``text`` (None: no router's page)."""
    for schema in ROUTERS:
        for prefix in schema.prefixes:
            if text.startswith(prefix) or "\n" + prefix in text:
                return schema
    return None
