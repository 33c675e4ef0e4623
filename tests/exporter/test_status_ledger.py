"""`prefixwatch status` prints the ledger of the request log, or says it needs one."""

from __future__ import annotations

import json

from prefixwatch.exporter.config import ConfigFlags, build_config
from prefixwatch.exporter.status import LEDGER_NEEDS_LOG, collect_status, ledger_status
from prefixwatch.simulator.engine import EngineConfig
from prefixwatch.simulator.server import Replica, ReplicaServer


def test_status_ledger_table_and_the_note_without_a_log(tmp_path) -> None:
    server = ReplicaServer(Replica(EngineConfig(num_blocks=64)), "127.0.0.1", 0)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        prompt = list(range(1, 41))  # 40 tokens: 2 full blocks of 16 cacheable
        log = tmp_path / "requests.jsonl"
        log.write_text("".join(json.dumps({"prompt_token_ids": prompt, "max_tokens": 4}) + "\n"
                               for _ in range(2)))
        config = build_config(ConfigFlags(
            targets=[url], requests_log={"path": str(log), "tokenizer": "none"}), environ={})
        rows = collect_status(config, 0.2)
        assert rows[0].pool_blocks == 64
        table = {line.split()[0]: line.split()[1] for line in ledger_status(config, rows)[3:]}
        # The second request reaches the first one's 2 blocks: 32 of 80 tokens.
        assert {k: table[k] for k in ("prompt", "novel", "routing", "eviction",
                                      "pool_reach")} == {
            "prompt": "80", "novel": "48", "routing": "0", "eviction": "0", "pool_reach": "32"}
        bare = build_config(ConfigFlags(targets=[url]), environ={})
        assert ledger_status(bare, collect_status(bare, 0.2)) == ["", LEDGER_NEEDS_LOG]
    finally:
        server.stop()


def test_landing_page_says_the_ledger_needs_a_log_and_shows_it_with_one(tmp_path) -> None:
    from prefixwatch.exporter.landing import render_landing
    from prefixwatch.exporter.service import Exporter

    server = ReplicaServer(Replica(EngineConfig(num_blocks=64)), "127.0.0.1", 0)
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        bare = Exporter(build_config(ConfigFlags(targets=[url],
                                                 listen_address="127.0.0.1:0"), environ={}))
        bare.poll_round()
        assert "needs a KV event stream" in render_landing(bare.landing_inputs())
        page = bare.registry.collect()
        assert not any(f.name.startswith("prefixwatch_ledger") for f in page)
        bare.stop()
        log = tmp_path / "requests.jsonl"
        log.write_text("")
        exp = Exporter(build_config(ConfigFlags(
            targets=[url], listen_address="127.0.0.1:0",
            requests_log={"path": str(log), "tokenizer": "none"}), environ={}))
        exp.poll_round()
        assert exp.view is not None
        exp.view.add(list(range(1, 41)))
        exp.view.add(list(range(1, 41)))
        html_page = render_landing(exp.landing_inputs())
        exp.stop()
        assert "Where the prompt tokens went" in html_page
        # One poll: no engine counters over the window yet, so no achieved, no unexplained.
        assert "pool_reach             32" in html_page and "unexplained" not in html_page
    finally:
        server.stop()


def test_a_failing_event_ledger_never_stops_the_polling(page_server, vllm_page, monkeypatch,
                                                        caplog) -> None:
    """Both of the ledger's readings around a poll may fail: the page is still read, the
    failure logged."""
    from prefixwatch.exporter.config import ExporterConfig, TargetConfig, name_targets
    from prefixwatch.exporter.service import Exporter

    exporter = Exporter(ExporterConfig(targets=name_targets([TargetConfig(page_server.url)]),
                                       listen_address="127.0.0.1:0", windows=("1m",)))

    def broken(*_args):
        raise RuntimeError("ledger bug")

    monkeypatch.setattr(exporter.kv_ledgers, "before_poll", broken)
    monkeypatch.setattr(exporter.kv_ledgers, "after_poll", broken)
    page_server.serve(vllm_page)
    exporter.poll_round()
    exporter.poll_round()
    assert exporter.monitors[0].view.up and exporter.rounds == 2
    assert caplog.text.count("kv event ledger failed") == 4


def test_status_hints_name_only_flags_status_takes() -> None:
    """A hint that names a flag `status` rejects sends a newcomer into an error."""
    import re

    from prefixwatch.cli import build_parser
    from prefixwatch.exporter.status import LEDGER_NEEDS_LOG, StatusRow, render

    parser = build_parser()
    status = parser._subparsers._group_actions[0].build("status")  # type: ignore[union-attr]
    takes = {s for a in status._actions for s in a.option_strings}
    said = LEDGER_NEEDS_LOG + render([StatusRow("t", "m", "vllm", "vllm_v1")], 5.0)
    assert "Diagnosis over the 5s gap" in said
    named = set(re.findall(r"(?<!exporter's )(--[a-z-]+)", said))
    assert named <= takes, named - takes
