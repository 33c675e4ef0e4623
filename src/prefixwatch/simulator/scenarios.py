"""Named workloads, one per cause in the runbook, each a realistic chat workload.

Every scenario builds on the same assistant: a long system prompt (instructions, tool schemas,
few-shot examples, ~1,800 tokens with the simulator's tokenizer) and varied user turns. Only
the one thing the scenario is about changes, so its effect on the hit rate is that cause alone.
"""

from __future__ import annotations

import itertools
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

_TOPICS = ("billing", "shipping", "returns", "accounts", "security", "warranty", "invoices",
           "subscriptions", "refunds", "orders", "passwords", "addresses", "discounts",
           "payments", "delivery", "exchanges")
_NAMES = ("Alice Martin", "Bob Chen", "Carla Diaz", "Deepak Rao", "Emma Schulz", "Farid Haddad",
          "Grace Kim", "Hugo Laurent", "Ines Costa", "Jonas Berg", "Keiko Sato", "Liam Walsh")


def _sentences(rng: random.Random, count: int, subject: str) -> list[str]:
    verbs = ("check", "confirm", "explain", "summarise", "verify", "describe", "compare",
             "review", "clarify", "document")
    objects = ("the order status", "the customer's plan", "the refund policy", "the last invoice",
               "the delivery window", "the account settings", "the warranty terms",
               "the open tickets", "the payment method", "the shipping address")
    tails = ("before answering", "in plain words", "without guessing", "with the exact figures",
             "and cite the policy section", "in at most three sentences",
             "and offer the next step", "and never invent data")
    return [f"{i + 1}. When the question is about {subject}, {rng.choice(verbs)} "
            f"{rng.choice(objects)} {rng.choice(tails)}." for i in range(count)]


@dataclass
class Corpus:
    """The fixed material every scenario draws on (deterministic from a seed)."""

    instructions: str
    tools: list[dict[str, Any]]
    few_shots: list[tuple[str, str]]
    passages: list[str]

    @classmethod
    def build(cls, seed: int = 7) -> Corpus:
        rng = random.Random(seed)
        lines = ["You are the customer-support assistant of Northwind Outfitters.",
                 "Follow these rules in order of priority."]
        for topic in _TOPICS[:10]:
            lines += _sentences(rng, 4, topic)
        instructions = "\n".join(lines)
        tools = []
        for name, topic in (("lookup_order", "orders"), ("get_invoice", "invoices"),
                            ("track_shipment", "shipping"), ("start_return", "returns"),
                            ("update_address", "addresses"), ("check_warranty", "warranty")):
            tools.append({
                "type": "function",
                "function": {
                    "name": name,
                    "description": f"Look up {topic} for the signed-in customer and return "
                                   f"the record with its status, dates and amounts.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "customer_id": {"type": "string", "description": "Customer id."},
                            "reference": {"type": "string",
                                          "description": f"The {topic} reference number."},
                            "include_history": {"type": "boolean",
                                                "description": "Also return past changes."},
                        },
                        "required": ["customer_id", "reference"],
                    },
                },
            })
        few_shots = []
        for i in range(20):
            topic = _TOPICS[i % len(_TOPICS)]
            few_shots.append((
                f"Example {i + 1}: a customer asks about {topic} for order {1000 + i * 7}.",
                f"Answer: I checked the {topic} record for order {1000 + i * 7}; it is in "
                f"order, and here is what happens next with the {topic} request.",
            ))
        passages = []
        for i in range(40):
            topic = rng.choice(_TOPICS)
            passages.append(f"[Document {i + 1}: {topic} policy] " + " ".join(
                _sentences(rng, 3, topic)))
        return cls(instructions, tools, few_shots, passages)

    def question(self, rng: random.Random) -> str:
        """A fresh user turn (~230 tokens): users rarely send the same message twice."""
        topic = rng.choice(_TOPICS)
        detail = " ".join(_sentences(rng, rng.randint(9, 14), topic))
        return (f"Hello, I have a question about {topic} for order "
                f"{rng.randint(10000, 99999)}. {detail} Can you help me?")

    def few_shot_text(self, shots: list[tuple[str, str]]) -> str:
        return "\n".join(f"{q}\n{a}" for q, a in shots)

    def system_prompt(self) -> str:
        return f"{self.instructions}\n\nExamples:\n{self.few_shot_text(self.few_shots[:6])}"


@dataclass
class Work:
    """One request of a workload, in the OpenAI chat or completion form."""

    body: dict[str, Any]
    route_key: str = ""
    #: The same request with its varying span made constant (the prompt-layout fix applied);
    #: None when nothing in it varies at the top. The ledger's truth for ``layout``.
    fixed: dict[str, Any] | None = None


Maker = Callable[[random.Random, Corpus, datetime], Work]


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    cause: str  # the runbook cause it reproduces
    make: Maker
    replicas: int = 1
    routing: str = "round-robin"  # or prefix-affinity
    num_blocks: int | None = None  # a pool size that shows the effect
    offload_blocks: int | None = None  # a host (CPU) tier behind the pool, in blocks
    lora_modules: tuple[str, ...] = field(default=())
    expected_hit_rate: str = ""


def _chat(system: str, user: str, tools: list[dict[str, Any]] | None = None, **extra: Any
          ) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": [{"role": "system", "content": system},
                                         {"role": "user", "content": user}],
                            "max_tokens": 32}
    if tools is not None:
        body["tools"] = tools
    body.update(extra)
    return body


def _stamp(now: datetime) -> str:
    return now.strftime("%Y-%m-%d %H:%M:%S.%f")


def _static(rng: random.Random, c: Corpus, now: datetime) -> Work:
    return Work(_chat(c.system_prompt(), c.question(rng), c.tools))


_FIXED_NOW = datetime(2025, 1, 1, 12, 0, 0, 123456)


def _timestamp_top(rng: random.Random, c: Corpus, now: datetime) -> Work:
    system = f"Current date and time: {_stamp(now)}\n{c.system_prompt()}"
    question = c.question(rng)
    fixed = f"Current date and time: {_stamp(_FIXED_NOW)}\n{c.system_prompt()}"
    return Work(_chat(system, question, c.tools), fixed=_chat(fixed, question, c.tools))


def _timestamp_end(rng: random.Random, c: Corpus, now: datetime) -> Work:
    user = f"{c.question(rng)}\n(Current date and time: {_stamp(now)})"
    return Work(_chat(c.system_prompt(), user, c.tools))


def _user_id(rng: random.Random, c: Corpus, now: datetime) -> Work:
    system = (f"You are helping {rng.choice(_NAMES)} (user id {uuid.UUID(int=rng.getrandbits(128))}"
              f").\n{c.system_prompt()}")
    question = c.question(rng)
    fixed = f"You are helping {_NAMES[0]} (user id {uuid.UUID(int=0)}).\n{c.system_prompt()}"
    return Work(_chat(system, question, c.tools), fixed=_chat(fixed, question, c.tools))


def _shuffled_tool(rng: random.Random, tool: Any) -> Any:
    if isinstance(tool, dict):
        items = list(tool.items())
        rng.shuffle(items)
        return {k: _shuffled_tool(rng, v) for k, v in items}
    return tool


def _unordered_tools(rng: random.Random, c: Corpus, now: datetime) -> Work:
    tools = [_shuffled_tool(rng, t) for t in c.tools]
    rng.shuffle(tools)
    return Work(_chat(c.system_prompt(), c.question(rng), tools))


def _rag_first(rng: random.Random, c: Corpus, now: datetime) -> Work:
    passages = "\n".join(rng.sample(c.passages, 3))
    system = f"Context documents:\n{passages}\n\n{c.system_prompt()}"
    return Work(_chat(system, c.question(rng), c.tools))


def _random_shots(rng: random.Random, c: Corpus, now: datetime) -> Work:
    shots = rng.sample(c.few_shots, 6)
    system = f"{c.instructions}\n\nExamples:\n{c.few_shot_text(shots)}"
    return Work(_chat(system, c.question(rng), c.tools))


def _tenant_system(c: Corpus, tenant: int) -> str:
    return f"You answer for tenant {tenant:03d} of Northwind Cloud.\n{c.system_prompt()}"


def _many_tenants(count: int, max_tokens: int = 32) -> Maker:
    def make(rng: random.Random, c: Corpus, now: datetime) -> Work:
        tenant = rng.randrange(count)
        question = c.question(rng)
        return Work(_chat(_tenant_system(c, tenant), question, c.tools, max_tokens=max_tokens),
                    route_key=f"tenant-{tenant}",
                    fixed=_chat(_tenant_system(c, 0), question, c.tools, max_tokens=max_tokens))
    return make


def _short(rng: random.Random, c: Corpus, now: datetime) -> Work:
    word = rng.choice(("hello", "thanks", "refund", "status", "help", "invoice", "cancel"))
    return Work({"prompt": f"Classify: {word}", "max_tokens": 4})


LORA_ADAPTERS = tuple(f"support-adapter-{i}" for i in range(8))


def _lora(rng: random.Random, c: Corpus, now: datetime) -> Work:
    adapter = rng.choice(LORA_ADAPTERS)
    return Work(_chat(c.system_prompt(), c.question(rng), c.tools, model=adapter),
                route_key=adapter)


#: SGLang's manual measures one 2,999-token prompt in three layouts (median cached tokens
#: 2998, 5 and 2985): the same prompt every time, a random id after its first 5 tokens, and the
#: same id after its first 2,985 tokens.
LAYOUT_PROMPT_TOKENS = 2999
LAYOUT_HEAD_TOKENS = 5
LAYOUT_TAIL_AT = 2985
LAYOUTS = ("same-prompt", "id-at-start", "id-at-end")


def _layout_words(count: int, start: int = 0) -> str:
    """``count`` tokens of fixed text (one word a token with the simulator's tokenizer)."""
    words = ("policy", "order", "refund", "invoice", "shipping", "account", "warranty",
             "address", "payment", "delivery", "return", "status", "customer", "record")
    return "".join(" " + words[(start + i) % len(words)] for i in range(count))


def _random_id(rng: random.Random) -> str:
    """One token that no other request has: a run of letters the tokenizer keeps whole."""
    return " " + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(16))


def layout_prompt(layout: str, rng: random.Random) -> str:
    """The manual's prompt in one layout: 2,999 tokens with the begin-of-text token."""
    head = "You are agent id"  # with the begin-of-text token: the 5 tokens before the id
    body = LAYOUT_PROMPT_TOKENS - LAYOUT_HEAD_TOKENS
    if layout == "same-prompt":
        return head + _layout_words(body)
    if layout == "id-at-start":
        return head + _random_id(rng) + _layout_words(body - 1)
    if layout == "id-at-end":
        before = LAYOUT_TAIL_AT - LAYOUT_HEAD_TOKENS
        return head + _layout_words(before) + _random_id(rng) + _layout_words(
            body - before - 1, start=before)
    raise ValueError(f"no layout {layout!r}")


def _three_layouts() -> Maker:
    turn = itertools.count()

    def make(rng: random.Random, c: Corpus, now: datetime) -> Work:
        layout = LAYOUTS[next(turn) % len(LAYOUTS)]
        return Work({"prompt": layout_prompt(layout, rng), "max_tokens": 8}, route_key=layout)
    return make


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("static-system-prompt", "Healthy baseline: the same long system prompt, tools and "
             "few-shots on every request; only the user turn varies.", "none", _static,
             expected_hit_rate="85-90%"),
    Scenario("timestamp-at-top", "The current date and time on the first line of the system "
             "prompt: every request differs from token ~10 on.", "timestamps", _timestamp_top,
             expected_hit_rate="~1%"),
    Scenario("timestamp-at-end", "The same timestamp, moved after the stable part (into the "
             "user turn): the fix for timestamp-at-top.", "timestamps (fixed)", _timestamp_end,
             expected_hit_rate="85-90%"),
    Scenario("user-id-in-system", "A user name and id at the top of the system prompt.",
             "user names or ids", _user_id, expected_hit_rate="~0-3%"),
    Scenario("unordered-tools", "Tool schemas serialised from an unordered dict: tool and key "
             "order change per request.", "tool schemas in unstable order", _unordered_tools,
             expected_hit_rate="~50%"),
    Scenario("rag-before-instructions", "Retrieved passages placed before the instructions.",
             "RAG passages before the instructions", _rag_first, expected_hit_rate="~0-5%"),
    Scenario("random-few-shots", "Few-shot examples sampled at random per request, after the "
             "instructions.", "random few-shots", _random_shots, expected_hit_rate="~40%"),
    Scenario("pool-pressure", "64 tenants with their own system prompt, long answers, and a KV "
             "pool that holds about 12 prompts: the running batch fills it, LRU eviction, "
             "preemptions.", "eviction under memory pressure", _many_tenants(64, 256),
             num_blocks=1500, expected_hit_rate="~15%"),
    Scenario("short-prompts", "Classification prompts shorter than one 16-token block: "
             "nothing can ever be cached.", "prompts under one block", _short,
             expected_hit_rate="0%"),
    Scenario("lora-adapters", "Requests spread over 8 LoRA adapters: each adapter has its own "
             "cache (no sharing by design).", "LoRA adapters", _lora,
             lora_modules=LORA_ADAPTERS, expected_hit_rate="high once warm, per adapter"),
    Scenario("round-robin", "24 tenants over 2 replicas, round-robin routing: every replica "
             "must hold every tenant's prefix, and the pools are too small for that.",
             "round-robin routing over replicas", _many_tenants(24), replicas=2,
             routing="round-robin", num_blocks=2200, expected_hit_rate="~55%"),
    Scenario("prefix-affinity", "The same 24 tenants and pools, routed by tenant: each replica "
             "holds half the prefixes, which fit.", "none (fix for round-robin)",
             _many_tenants(24), replicas=2, routing="prefix-affinity", num_blocks=2200,
             expected_hit_rate="~85%"),
    Scenario("offload-rescue", "16 tenants with their own system prompt and a device pool "
             "that holds about 7 of them; a host (CPU) tier of 8,192 blocks catches what the "
             "pool evicts: the device ratio is low, the effective ratio stays high.",
             "none: a second tier serves what the device pool evicted", _many_tenants(16),
             num_blocks=1000, offload_blocks=8192,
             expected_hit_rate="~42% device + ~43% host = ~85% effective"),
    Scenario("offload-idle", "The timestamp-at-top workload with a host tier: every block is "
             "stored to host memory and none is ever asked for again, while the device pool "
             "misses almost everything.", "a second tier that stores but serves nothing",
             _timestamp_top, offload_blocks=8192, expected_hit_rate="~1% device, ~0% host"),
    Scenario("three-layouts", "SGLang's manual table: one 2,999-token prompt in turn the same "
             "every time, with a random id after its first 5 tokens, and with it after its "
             "first 2,985 (run with --engine sglang: median cached tokens 2998, 5 and 2985).",
             "a per-request value near the top", _three_layouts(),
             expected_hit_rate="~66% (2998 + 5 + 2985 of 3 x 2999 tokens)"),
)}


def describe() -> str:
    width = max(len(n) for n in SCENARIOS)
    lines = []
    for s in SCENARIOS.values():
        extra = []
        if s.replicas > 1:
            extra.append(f"{s.replicas} replicas, {s.routing}")
        if s.num_blocks:
            extra.append(f"KV pool {s.num_blocks} blocks")
        if s.offload_blocks:
            extra.append(f"host tier {s.offload_blocks} blocks")
        note = f" [{'; '.join(extra)}]" if extra else ""
        lines.append(f"{s.name.ljust(width)}  expected hit rate {s.expected_hit_rate}{note}\n"
                     f"{' ' * width}  {s.summary}\n{' ' * width}  runbook cause: {s.cause}")
    return "\n".join(lines)

