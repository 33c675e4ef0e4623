"""The README's two set-up commands stay true: CI runs the test one, the main one exists."""

from __future__ import annotations

import re
from pathlib import Path

from prefixwatch.cli import build_parser

ROOT = Path(__file__).parent.parent


def setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert block, "the README starts with a sh block"
    assert text.index(block.group(0)) < text.index("---"), "the commands come first"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_exactly_two_commands_and_ci_runs_the_test_one() -> None:
    main, tests = setup_commands()
    assert tests in (ROOT / ".ci" / "run").read_text()
    assert "pytest" in tests
    sub = main.split("prefixwatch ", 1)[1].split()[0]
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert sub in choices
