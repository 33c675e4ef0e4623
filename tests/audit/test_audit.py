"""The prompt audit: known answers, a brute-force reference, and agreement with the simulator."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prefixwatch.audit.analysis import Auditor, diff
from prefixwatch.core.cache.whatvaries import guess_kind
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.scenarios import SCENARIOS, Corpus
from prefixwatch.simulator.server import Replica, ReplicaServer
from tests.conftest import refused_port
from tests.core.test_blockcache import reference_cached


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "prefixwatch.cli", "audit", *args],
                          capture_output=True, text=True, input=stdin, timeout=120)


def tokens(n: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 50000) for _ in range(n)]


@pytest.mark.parametrize("position,reusable", [(8, 0), (2390, 149), (2405, 150)])
def test_known_answers_for_two_requests(position: int, reusable: int, tmp_path: Path) -> None:
    """A 2,400-token system part and a short user turn (2,410 tokens in all): a timestamp at
    token 8, at token 2,390, or in the user message."""
    base = tokens(2410)
    changed = list(base)
    changed[position] += 1
    result = diff(base, changed, 16)
    assert result["first_divergent_token"] == position
    assert (result["reusable_blocks"], result["blocks"]) == (reusable, 150)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"prompt_token_ids": base}))
    b.write_text(json.dumps({"prompt_token_ids": changed}))
    out = run("diff", str(a), str(b))
    assert out.returncode == 0, out.stderr
    assert f"first divergent token: {position}" in out.stdout
    assert f"reusable blocks: {reusable} of 150" in out.stdout


def test_log_known_answers() -> None:
    auditor = Auditor(16)
    system = tokens(2400, 1)
    first = auditor.add(system + tokens(40, 2))
    assert first.cacheable_tokens == 0 and first.divergence is None
    second = auditor.add(system + tokens(40, 3))
    assert second.cacheable_tokens == 2400
    assert second.divergence is not None and second.divergence.position == 2400
    stamped = list(system)
    stamped[8] = 7
    third = auditor.add(stamped + tokens(40, 4))
    assert third.cacheable_tokens == 0 and third.divergence.position == 8
    assert auditor.report.positions[8] == 1


@settings(max_examples=100, deadline=None)
@given(data=st.data(), bs=st.sampled_from([1, 2, 4, 16]))
def test_cacheable_tokens_equal_the_brute_force_reference(data, bs: int) -> None:
    auditor = Auditor(bs)
    base = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=40))
    history: list[tuple[list[int], object]] = []
    for _ in range(data.draw(st.integers(1, 12))):
        cut = data.draw(st.integers(0, len(base)))
        prompt = base[:cut] + data.draw(st.lists(st.integers(1, 3), max_size=20)) or [1]
        extra = data.draw(st.sampled_from([None, ("lora", None), (None, "salt")]))
        result = auditor.add(prompt, extra)
        assert result.cacheable_tokens == reference_cached(history, prompt, extra, bs)
        same = [p for p, e in history if e == extra]
        if result.divergence is not None:
            # The position is the longest common prefix with some earlier request.
            lcps = []
            for p in same:
                k = 0
                while k < min(len(p), len(prompt)) and p[k] == prompt[k]:
                    k += 1
                lcps.append(k)
            assert result.divergence.position == max(lcps)
        history.append((prompt, extra))


def test_lru_replay_matches_the_simulator_engine() -> None:
    """--kv-blocks replays through the same pool the simulator runs."""
    from prefixwatch.simulator.engine import Engine, VirtualClock

    prompts = [tokens(64, i % 5) + tokens(30, 100 + i) for i in range(40)]
    auditor = Auditor(16, kv_blocks=14)
    engine = Engine(EngineConfig(num_blocks=14, time_per_output_token=0.001),
                    clock=VirtualClock())
    for p in prompts:
        simulated = auditor.add(p).simulated_cached_tokens
        req = engine.submit(p, 1)
        engine.run_until_idle()
        assert simulated == req.cached_tokens
    assert auditor.report.simulated_hit_rate < auditor.report.achievable_hit_rate


@pytest.mark.parametrize("mine,theirs,kind", [
    ("2026-11-30 06:11:52", "2026-11-30 06:11:57", "date/time"),
    ("id 3f2b9c1e-77aa-4c1b", "id 9a0c2d44-1e0b-4f3a", "id"),
    ('{"name": "f", "parameters"', '{"parameters": {}, "name"', "key order"),
    ("order 12345 is late", "order 99812 is late", "number"),
    ("Dear Alice Martin,", "Dear Bob Chen,", "name"),
    ("Document 3: returns policy", "You are the assistant", "text"),
])
def test_kind_guesses(mine: str, theirs: str, kind: str) -> None:
    assert guess_kind(mine, theirs) == kind


def write_log(path: Path, scenario: str, n: int, seed: int = 1) -> None:
    from datetime import UTC, datetime, timedelta

    sc, corpus, rng = SCENARIOS[scenario], Corpus.build(), random.Random(seed)
    start = datetime(2026, 11, 30, tzinfo=UTC)
    with path.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps(sc.make(rng, corpus, start + timedelta(seconds=i)).body) + "\n")


def test_report_names_the_timestamp_and_its_fix(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    write_log(log, "timestamp-at-top", 30)
    with log.open("a") as fh:
        fh.write("{not json\n")
        fh.write('{"no": "prompt"}\n')
    out = run(str(log), "--tokenizer", "builtin", "--format", "json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["requests"] == 30 and report["skipped_lines"] == 2
    assert report["achievable_hit_rate"] < 0.05
    top = report["divergence"][0]
    assert top["kind"] == "date/time" and top["count"] >= 20 and "2026-11-30" in top["context"]
    assert "requests.jsonl:31" in out.stderr and "not JSON" in out.stderr
    redacted = json.loads(run(str(log), "--tokenizer", "builtin", "--format", "json",
                              "--redact").stdout)
    assert redacted["divergence"][0]["context"] == "[redacted]"
    failing = run(str(log), "--tokenizer", "builtin", "--fail-under", "0.5")
    assert failing.returncode == 1
    assert "achievable hit rate" in failing.stdout and "date/time" in failing.stdout
    healthy = tmp_path / "healthy.jsonl"
    write_log(healthy, "static-system-prompt", 30)
    ok = run(str(healthy), "--tokenizer", "builtin", "--fail-under", "0.5", "--kv-blocks",
             "4000", "--format", "json")
    assert ok.returncode == 0
    assert json.loads(ok.stdout)["achievable_hit_rate"] > 0.8
    assert json.loads(ok.stdout)["simulated_hit_rate"] > 0.8


def test_bad_setup_exits_2(tmp_path: Path) -> None:
    log = tmp_path / "r.jsonl"
    log.write_text('{"prompt": "hello"}\n')
    assert run(str(log), "--server", "http://127.0.0.1:9").returncode == 2
    assert run(str(log), "--tokenizer", str(tmp_path / "nope")).returncode == 2
    assert run(str(tmp_path / "missing.jsonl")).returncode == 2
    assert run("diff", str(log)).returncode == 2


def test_text_lines_without_a_tokenizer_are_one_error(tmp_path: Path) -> None:
    """Not a warning per line and an empty report with exit 0: one line, exit 2."""
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"prompt_token_ids": tokens(40)}) + "\n"
                   + '{"messages": [{"role": "user", "content": "hi"}]}\n' * 50)
    out = run(str(log), "--format", "json")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"prefixwatch audit: error: {log}:2 is a text request (chat or completion), which "
        "needs a tokenizer: give --server URL (vLLM's /tokenize), --tokenizer DIR (a Hugging "
        "Face tokenizer) or --tokenizer builtin (the simulator's); pre-tokenized lines "
        "(prompt_token_ids) need none"]


def test_unreachable_server_is_one_sentence_with_the_url(tmp_path: Path) -> None:
    log = tmp_path / "r.jsonl"
    log.write_text('{"prompt": "hello"}\n')
    with refused_port() as port:
        out = run(str(log), "--server", f"http://127.0.0.1:{port}")
    assert out.returncode == 2
    assert out.stderr == ("prefixwatch audit: error: cannot tokenize: nothing answers at "
                          f"http://127.0.0.1:{port} (connection refused): is the server "
                          "running and is the address right?\n")
    bad = run(str(log), "--server", "localhost:8000")
    assert bad.returncode == 2 and "is not an http(s) URL" in bad.stderr
    assert "Traceback" not in bad.stderr and len(bad.stderr.splitlines()) == 1


@pytest.mark.parametrize("ids, detail", [
    ("[5, 2.0]", "got `float`"), ("[5, -3]", "`int` >= 0"), ("[5, true]", "got `bool`"),
    ('[5, "7"]', "got `str`"), ("[5, [7]]", "got `array`"), ("null", "got `null`"),
    ("[]", ""),
])
def test_bad_token_ids_are_refused_with_their_line(ids: str, detail: str, tmp_path: Path
                                                   ) -> None:
    """Booleans, floats, negative or non-numeric ids: the line is named and skipped (the
    decoder checks every id; none is converted); alone in a log, one line and exit 2."""
    from prefixwatch.core.logs.formats import BadLine, read_jsonl

    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"prompt_token_ids": tokens(40)}) + "\n"
                   + f'{{"prompt_token_ids": {ids}}}\n')
    good, bad = read_jsonl([str(log)])
    assert list(good.token_ids) == tokens(40)
    assert isinstance(bad, BadLine) and bad.where == f"{log}:2"
    assert bad.reason.startswith("prompt_token_ids must be a non-empty list of token ids")
    assert detail in bad.reason
    if ids != "[5, true]":
        return  # one process is enough to show the command's side of it
    alone = tmp_path / "bad.jsonl"
    alone.write_text(f'{{"prompt_token_ids": {ids}}}\n')
    out = run(str(alone), "--format", "json", "--no-progress")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        f"prefixwatch audit: error: no request could be read: 1 line(s) skipped (first, "
        f"{alone}:1: {bad.reason})"]


@pytest.mark.parametrize("line, reason", [
    ('{"prompt_token_ids": [5, -3], "lora": 7}',
     "prompt_token_ids must be a non-empty list of token ids (expected `int` >= 0 at "
     "prompt_token_ids[1])"),
    ('{"lora": 7, "prompt_token_ids": [5, -3]}',
     "lora must be a string (expected `str | null`, got `int` at lora)"),
    ('{"prompt": [5, -3]}',
     "prompt must be a non-empty string or a non-empty list of token ids (expected `int` >= 0 "
     "at prompt[1])"),
])
def test_a_line_the_fast_pass_refuses_gets_the_strict_reason(line: str, reason: str,
                                                             tmp_path: Path) -> None:
    """simdjson's pass leaves these lines to the strict decoder, whose first error, in the
    line's own order, is the reason."""
    from prefixwatch.core.logs.formats import BadLine, read_jsonl

    log = tmp_path / "r.jsonl"
    log.write_text(line + "\n")
    (bad,) = read_jsonl([str(log)])
    assert isinstance(bad, BadLine) and (bad.where, bad.reason) == (f"{log}:1", reason)


def test_token_ids_beyond_32_bits_are_refused(tmp_path: Path) -> None:
    from prefixwatch.core.logs.formats import BadLine, read_jsonl

    log = tmp_path / "r.jsonl"
    log.write_text('{"prompt_token_ids": [1, 4294967296]}\n{"prompt": [1, 4294967295]}\n')
    big, top = read_jsonl([str(log)])
    assert isinstance(big, BadLine) and "beyond 32 bits" in big.reason
    assert list(top.token_ids) == [1, 4294967295]


def test_stdin_and_pretokenized_lora_salt() -> None:
    lines = [json.dumps({"prompt_token_ids": tokens(100)}),
             json.dumps({"prompt_token_ids": tokens(100), "lora": "a"}),
             json.dumps({"prompt_token_ids": tokens(100), "cache_salt": "t1"}),
             json.dumps({"prompt_token_ids": tokens(100)})]
    out = run("-", "--format", "json", stdin="\n".join(lines) + "\n")
    report = json.loads(out.stdout)
    assert report["requests"] == 4 and report["cacheable_tokens"] == 96


@pytest.mark.integration
def test_server_tokenize_and_audit_agree_with_the_simulators_counters(tmp_path: Path) -> None:
    """The simulator's /tokenize and the audit predict exactly the hits its own counters
    record, on the same log, sent one request after another."""
    import requests

    log = tmp_path / "requests.jsonl"
    write_log(log, "random-few-shots", 25, seed=3)
    replica = Replica(EngineConfig(time_per_output_token=0.0005, max_model_len=8192))
    srv = ReplicaServer(replica, "127.0.0.1", 0)
    srv.start()
    try:
        url = f"http://127.0.0.1:{srv.port}"
        for line in log.read_text().splitlines():
            body = {**json.loads(line), "max_tokens": 1}
            assert requests.post(url + "/v1/chat/completions", json=body, timeout=30).ok
        out = run(str(log), "--server", url, "--format", "json", "--kv-blocks",
                  str(replica.config.num_blocks))
        assert out.returncode == 0, out.stderr
        report = json.loads(out.stdout)
        stats = replica.engine.stats
        assert report["prompt_tokens"] == stats.prefix_queries
        assert report["cacheable_tokens"] == stats.prefix_hits
        assert report["block_size"] == 16
    finally:
        srv.stop()


def hf_tokenizer_dir(path: Path) -> Path:
    """A tiny Hugging Face tokenizer with a chat template, built offline."""
    tokenizers = pytest.importorskip("tokenizers", reason="pip install 'prefixwatch[hf]'")
    transformers = pytest.importorskip("transformers", reason="pip install 'prefixwatch[hf]'")
    words = ("<s> [UNK] system user assistant : you are a helpful support bot answer in plain "
             "words current date and time is 2026-11-30 06:11:52 06:11:57 06:12:03 hello "
             "please help me with my order refund shipping").split()
    vocab = {w: i for i, w in enumerate(dict.fromkeys(words))}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]",
                                                bos_token="<s>")
    fast.chat_template = ("<s> {% for m in messages %}{{ m['role'] }} : {{ m['content'] }} "
                          "{% endfor %}{% if add_generation_prompt %}assistant : {% endif %}")
    fast.save_pretrained(str(path))
    return path


def test_local_hugging_face_tokenizer(tmp_path: Path) -> None:
    directory = hf_tokenizer_dir(tmp_path / "tok")
    system = "you are a helpful support bot answer in plain words " * 4
    log = tmp_path / "r.jsonl"
    stamps = ("06:11:52", "06:11:57", "06:12:03")
    with log.open("w") as fh:
        for stamp in stamps:
            messages = [{"role": "system",
                         "content": f"current date and time is 2026-11-30 {stamp} {system}"},
                        {"role": "user", "content": "hello please help me with my order"}]
            fh.write(json.dumps({"messages": messages}) + "\n")
    out = run(str(log), "--tokenizer", str(directory), "--format", "json", "--block-size", "4")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["skipped_lines"] == 0, out.stderr
    assert report["requests"] == 3 and report["cacheable_tokens"] == 2 * 8
    top = report["divergence"][0]
    # <s> system : current date and time is 2026-11-30 | 06:11:xx: token 9 differs.
    assert top["position"] == 9 and top["count"] == 2 and top["kind"] == "date/time"


def _audit_kinds(log: Path, *flags: str) -> set[str]:
    out = run(str(log), "--format", "json", *flags)
    assert out.returncode == 0, out.stderr
    return {row["kind"] for row in json.loads(out.stdout)["divergence"]}


def test_healthy_logs_raise_no_false_alarm(tmp_path: Path) -> None:
    """Where each request's own content starts (the user's question, numbered or not) is
    not something to fix: chat, completion and pre-tokenized healthy logs name no problem."""
    chat = tmp_path / "chat.jsonl"
    write_log(chat, "static-system-prompt", 30)
    assert _audit_kinds(chat, "--tokenizer", "builtin") == {"own content"}
    instructions = "\n".join(f"Rule {i}: answer politely and cite the order number." for i in
                             range(60))
    completion = tmp_path / "completion.jsonl"
    completion.write_text("".join(
        json.dumps({"prompt": f"{instructions}\nQuestion {n}: where is order {1000 + n}?"})
        + "\n" for n in range(30)))
    assert _audit_kinds(completion, "--tokenizer", "builtin") == {"own content"}
    system = tokens(1200, 5)
    pretokenized = tmp_path / "ids.jsonl"
    pretokenized.write_text("".join(
        json.dumps({"prompt_token_ids": system + tokens(60, 100 + n)}) + "\n"
        for n in range(30)))
    assert _audit_kinds(pretokenized) == {"own content"}


def test_a_change_near_the_top_is_still_named(tmp_path: Path) -> None:
    """The same logs with a number near the top: flagged; token ids alone: not guessed."""
    completion = tmp_path / "completion.jsonl"
    instructions = "\n".join(f"Rule {i}: answer politely." for i in range(60))
    completion.write_text("".join(
        json.dumps({"prompt": f"Ticket {5000 + n}\n{instructions}\nQuestion: where?"}) + "\n"
        for n in range(30)))
    assert _audit_kinds(completion, "--tokenizer", "builtin") == {"number"}
    system = tokens(1200, 5)
    pretokenized = tmp_path / "ids.jsonl"
    pretokenized.write_text("".join(
        json.dumps({"prompt_token_ids": system[:8] + [n] + system[8:]}) + "\n"
        for n in range(30)))
    kinds = _audit_kinds(pretokenized)
    assert kinds == {"token ids"}


@pytest.mark.parametrize("shared,decoded,kind", [
    (0.9, True, "own content"), (0.7, False, "own content"), (0.69, True, "number"),
    (None, True, "number"), (0.1, False, "token ids"),
])
def test_kind_guess_uses_the_shared_share(shared: float | None, decoded: bool,
                                          kind: str) -> None:
    assert guess_kind("Question 17: x", "Question 18: y", "", shared, decoded) == kind


def test_the_answer_comes_first_and_rows_are_grouped(tmp_path: Path) -> None:
    """One headline line names the culprit over every token it shows at (the seconds and the
    minutes of one timestamp are one culprit), the share a fix would serve and the fix; the
    rows follow grouped by what varies; where each request's own content starts is one
    summed line, last."""
    log = tmp_path / "requests.jsonl"
    write_log(log, "timestamp-at-top", 200)
    out = run(str(log), "--tokenizer", "builtin")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert re.fullmatch(r"Culprit: a date/time at tokens \d+-\d+ of the prompt changes on every "
                        r"request: \d+\.\d% of prompt tokens a layout fix would serve\. Fix: "
                        r"Move the date or time out of the prefix.*", first), first
    assert out.stdout.count("date/time (") == 1  # one group, however many positions
    healthy = tmp_path / "healthy.jsonl"
    write_log(healthy, "static-system-prompt", 60)
    ok = run(str(healthy), "--tokenizer", "builtin")
    lines = ok.stdout.splitlines()
    assert lines[0].startswith("No culprit: the requests share their prefix"), lines[0]
    own = [i for i, line in enumerate(lines) if line.startswith("own content (")]
    assert len(own) == 1 and "summed" in lines[own[0] + 1], ok.stdout
    as_json = json.loads(run(str(log), "--tokenizer", "builtin", "--format", "json").stdout)
    assert as_json["headline"] == first


def test_an_empty_log_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = run(str(empty))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"prefixwatch audit: error: no request in {empty}: the log is empty (a JSONL request "
        "log has one request a line)"]
