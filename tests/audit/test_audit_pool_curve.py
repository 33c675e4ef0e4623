"""`prefixwatch audit --kv-blocks N` replays the log at N blocks and at 1.25, 1.5, 2 and 4 times
N: the same curve the exporter's what-if gives from the KV event stream, here compared with
the simulator run at each size (the audit replays prompts only, no answers: within 3 points)."""

from __future__ import annotations

import json

from prefixwatch.cli import main
from prefixwatch.simulator import poolcheck

COUNT = 150


def test_the_audits_pool_curve_is_the_simulators_at_each_size(tmp_path, capsys) -> None:
    work = poolcheck.requests("working-set", COUNT)
    log = tmp_path / "working-set.jsonl"
    log.write_text("".join(json.dumps({"prompt_token_ids": p, "max_tokens": m}) + "\n"
                           for p, m in work))
    assert main(["audit", str(log), "--block-size", "16", "--kv-blocks", "500", "--format",
                 "json", "--no-progress"]) == 0
    curve = json.loads(capsys.readouterr().out)["pool_curve"]
    assert set(curve) == {"1", "1.25", "1.5", "2", "4"}
    for scale, ratio in curve.items():
        ran = poolcheck.run(round(500 * float(scale)), work)
        assert abs(ratio - ran.ratio) <= 0.03, (scale, ratio, ran)
    assert main(["audit", str(log), "--block-size", "16", "--kv-blocks", "500",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "The pool curve" in text and "the KV pool the hit ratio would have been" in text
    assert main(["audit", str(log), "--block-size", "16", "--kv-blocks", "500",
                 "--no-pool-curve", "--no-progress"]) == 0
    assert "The pool curve" not in capsys.readouterr().out


def test_a_timestamp_at_the_top_reads_flat_in_the_audit_too(tmp_path, capsys) -> None:
    work = poolcheck.requests("timestamp-at-top", 60)
    log = tmp_path / "timestamp.jsonl"
    log.write_text("".join(json.dumps({"prompt_token_ids": p}) + "\n" for p, _m in work))
    assert main(["audit", str(log), "--block-size", "16", "--kv-blocks", "500",
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "more memory would not help: 2x the pool gains 0 points; the missed tokens are " \
           "layout" in text
