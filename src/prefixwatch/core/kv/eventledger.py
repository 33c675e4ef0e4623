"""The ledger from the event source: the engines' counters beside their KV event streams.

Over a span, the engine's counters give the prompt tokens, the cached tokens (every tier), the
generated tokens and the finished requests; the stream gives the tokens of every device block
the engine computed, by why (``core/kv/mirror.py``). vLLM caches every full block a request
fills, its answer's blocks included (``BlockPool.cache_full_blocks`` runs for every scheduled
token, capped at ``request.num_tokens``), and the last token a request samples is never fed
back, so a finished request's KV covers ``prompt + generated - 1`` tokens. Hence, to the token,

    prompt + output = achieved + eviction + routing + layout + novel + tail + unexplained

with ``output`` = generated tokens - one per finished request (the generated tokens whose KV
the engine computed) and ``tail`` the tokens of each request's last partial block, which no
full block covers and the stream never shows (at most ``block_size - 1`` per finished request).
The ledger is one of the prompt tokens, so ``output`` is taken out of the parts that hold it:
an answer is new content, so out of ``novel`` first; an answer shorter than its prompt's last
block stays in the request's partial block, so then out of the ``tail``; then out of
``routing``, ``eviction`` and ``layout`` (answers repeating content a replica held). Then

    prompt = achieved + eviction + routing + layout + novel + tail + unexplained

and the shares of the prompt tokens sum to 1, with ``output`` named beside them.

A span's edges: the counters move at other moments than the stream (prefix-cache queries at a
request's scheduling, generated tokens per step, finished requests at the end), so a request
running at an edge has up to ``block_size`` tokens counted and not yet stored (or stored in the
span and counted before it), and the stream may move while a page is fetched. ``edges`` gives
those slacks in tokens; a residual within them is still the tail, past them ``unexplained``
(lost messages, a stream followed from mid-way, preemption, a chunked prefill under way at an
edge).

SGLang stores a run its radix tree already holds once (``RadixCache.insert`` frees the
request's copy): what a request recomputed over content the tree held never reaches the
stream, whatever its size (the last prompt token SGLang always computes, an answer repeated
word for word, two requests of one prefill batch computing the same new prompt). Its stream
holds the new pages only, each a prompt's or an answer's. So for SGLang the answers are taken
out of the stream's parts only as far as the stream holds more than the prompts computed
(``prompt - achieved``): the rest of the output was stored by nobody. What the prompts
computed and the stream does not show is the tail: a request's last partial page and the page
(the token, with SGLang's default page size 1) it recomputes when its prompt was cached whole,
at most ``page_size`` tokens per finished request; past that, ``unexplained``.
"""

from __future__ import annotations

from prefixwatch.core.vocab import exposition

#: The event ledger's counted parts. The counters keep the request ledger's identity (prompt =
#: novel + layout + routing + eviction + pool_reach, so rules written for it stay true) with
#: ``pool_reach`` = achieved + tail + unexplained, and count the tail and the output (generated
#: tokens whose KV was computed, not prompt tokens) on their own as well.
EVENT_COUNTED: tuple[str, ...] = ("prompt", "novel", "layout", "routing", "eviction",
                                  exposition.LEDGER_TAIL, "pool_reach", exposition.LEDGER_OUTPUT)
#: The shares of the prompt tokens (they sum to 1), in the order a table prints them.
EVENT_SHARES: tuple[str, ...] = exposition.KV_LEDGER_SHARES
#: Where the output is taken from, in this order (see the module docstring).
OUTPUT_FROM: tuple[str, ...] = ("novel", exposition.LEDGER_TAIL, "routing", "eviction", "layout")


#: The stream parts an SGLang answer is taken from (the tail is not on its stream).
SGLANG_OUTPUT_FROM: tuple[str, ...] = ("novel", "routing", "eviction", "layout")


def event_shares(prompt: int, achieved: int, computed: dict[str, int], requests: int | None,
                 block_size: int, output: int = 0, edges: tuple[int, int] = (0, 0),
                 engine: str = "vllm") -> dict[str, int]:
    """The ledger of a span from the event source, in tokens: the shares (summing to
    ``prompt``) and ``output``.

    ``prompt``, ``achieved`` (cached tokens, every tier) and ``output`` (generated tokens minus
    finished requests) are the engines' counters over the span, ``requests`` its finished
    requests (None: not known, the tail is not bounded); ``computed`` the stream's computed
    tokens by part (whole device blocks, answers' included); ``edges`` (low, high) the tokens
    the span's edges may move the residual down and up. ``engine`` "sglang": its stream
    stores a run once (the module docstring); ``block_size`` is then its page size."""
    if engine == "sglang":
        return _stored_once_shares(prompt, achieved, computed, requests, block_size, output,
                                   edges)
    stream = sum(computed.get(p, 0) for p in exposition.KV_COMPUTED_PARTS)
    residual = prompt + output - achieved - stream
    low, high = edges
    top = residual if requests is None else (block_size - 1) * max(requests, 0) + high
    tail = min(max(residual, -low), max(top, -low))
    out = {"achieved": achieved}
    out.update({p: computed.get(p, 0) for p in exposition.KV_COMPUTED_PARTS})
    out[exposition.LEDGER_TAIL] = tail
    out["unexplained"] = residual - tail
    left = max(output, 0)
    for part in OUTPUT_FROM:
        take = min(left, max(out[part], 0))
        out[part] -= take
        left -= take
    out["unexplained"] -= left  # more output than the stream and the tails hold
    out[exposition.LEDGER_OUTPUT] = output
    return out


def _stored_once_shares(prompt: int, achieved: int, computed: dict[str, int],
                        requests: int | None, page_size: int, output: int,
                        edges: tuple[int, int]) -> dict[str, int]:
    """``event_shares`` for an engine whose stream shows each run once (SGLang)."""
    stream = sum(computed.get(p, 0) for p in exposition.KV_COMPUTED_PARTS)
    out = {"achieved": achieved}
    out.update({p: computed.get(p, 0) for p in exposition.KV_COMPUTED_PARTS})
    # The answers' pages the stream holds: what it holds beyond the prompts' computed tokens.
    left = min(max(output, 0), max(stream - (prompt - achieved), 0))
    for part in SGLANG_OUTPUT_FROM:
        take = min(left, max(out[part], 0))
        out[part] -= take
        left -= take
    residual = prompt - achieved - sum(out[p] for p in exposition.KV_COMPUTED_PARTS)
    low, high = edges
    top = residual if requests is None else page_size * max(requests, 0) + high
    tail = min(max(residual, -low), max(top, -low))
    out[exposition.LEDGER_TAIL] = tail
    out["unexplained"] = residual - tail
    out[exposition.LEDGER_OUTPUT] = output
    return out


def event_counted(shares_: dict[str, int], prompt: int) -> dict[str, int]:
    """The counters of ``EVENT_COUNTED`` from ``event_shares``: pool_reach = achieved + tail +
    unexplained (what no computed full block explains), so prompt = novel + layout + routing +
    eviction + pool_reach as in the request ledger; the tail and the output on their own."""
    out = {"prompt": prompt}
    out.update({p: shares_[p] for p in ("novel", "layout", "routing", "eviction",
                                         exposition.LEDGER_TAIL, exposition.LEDGER_OUTPUT)})
    out["pool_reach"] = (shares_["achieved"] + shares_[exposition.LEDGER_TAIL]
                         + shares_["unexplained"])
    return out


def event_table(shares_: dict[str, int], prompt: int) -> list[str]:
    """The event ledger as text rows, as ``core.ledger.table`` prints the request ledger: the
    shares of the prompt tokens, then the output beside them (not one of them)."""
    notes = {"achieved": "the engines' cached tokens (every tier)",
             "eviction": "this replica held it, then removed it",
             "routing": "another replica held it",
             "layout": "a prompt-layout fix would share it",
             "novel": "no replica held it",
             exposition.LEDGER_TAIL: "each request's last partial block (never cached)",
             "unexplained": "lost messages, preemption, a stream started mid-way",
             exposition.LEDGER_OUTPUT: "generated tokens' KV (cached too), taken out of the parts "
                                  "above: not prompt"}
    rows = [f"{'PART':<12} {'TOKENS':>12} {'SHARE':>7}", f"{'prompt':<12} {prompt:>12} "
            f"{(1.0 if prompt else 0.0):7.1%}"]
    for part in (*EVENT_SHARES, exposition.LEDGER_OUTPUT):
        v = shares_.get(part, 0)
        share = f"{v / prompt:7.1%}" if prompt else f"{'-':>7}"
        rows.append(f"{part:<12} {v:>12} {share}  {notes[part]}")
    return rows
