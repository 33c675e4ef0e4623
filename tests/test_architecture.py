"""docs/architecture.md lists every module under src/, in its package's place."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "src" / "prefixwatch"


def listed_modules(doc: str) -> set[str]:
    """Module paths (relative to src/prefixwatch) named in the map's tree: names sit left of a
    gap of three spaces; a name ending in / opens a package at its indentation."""
    tree = doc.split("```\nsrc/prefixwatch/\n", 1)[1].split("```", 1)[0]
    out: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in tree.splitlines():
        names = re.split(r" {3,}", line.strip(), maxsplit=1)[0]
        if not names:
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        prefix = "".join(p for _, p in stack)
        for name in names.split():
            if name.endswith("/"):
                stack.append((indent, name))
            elif name.endswith(".py"):
                out.add(prefix + name)
    return out


def test_every_module_is_on_the_map() -> None:
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")}
    listed = listed_modules((ROOT / "docs" / "architecture.md").read_text())
    assert modules - listed == set(), "add them to docs/architecture.md"
    assert listed - modules == set(), "docs/architecture.md names modules that do not exist"
