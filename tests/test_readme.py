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
    # The main job is the compose stack (checked in tests/test_stack.py); its Docker-free twin
    # is a prefixwatch command the README shows right after.
    assert main == "docker compose up"
    assert (ROOT / "docker-compose.yml").exists()
    text = (ROOT / "README.md").read_text()
    native = re.search(r"pip install \. && prefixwatch (\w+)", text)
    assert native, "the README shows how to run without Docker"
    choices = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert native.group(1) in choices
