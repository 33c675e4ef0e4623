"""The shape of the code: docs/architecture.md lists every module under src/ in its package's
place; no function is over 100 lines; no module reads another object's private attribute; a
target's readers see only its frozen view, never its monitor's lock."""

from __future__ import annotations

import ast
import functools
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


@functools.cache
def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text(), str(p)))
            for p in sorted(PACKAGE.rglob("*.py"))]


MAX_FUNCTION_LINES = 100


def test_no_function_is_over_100_lines() -> None:
    long = {f"{where} {node.name}" for where, tree in _modules() for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
    assert long == set(), "split them along their steps"


#: Private names of the standard library that have no public spelling: argparse's class of
#: add_subparsers' result, which a sub-command's parser builder is handed.
STDLIB_PRIVATE = {"argparse._SubParsersAction"}


def _own_private_names(tree: ast.Module) -> set[str]:
    """Private attributes a module puts on objects other than ``self`` itself (a keyword it
    passes, ``obj._name = ...``): reading them back is reading its own."""
    own = {kw.arg for node in ast.walk(tree) if isinstance(node, ast.Call)
           for kw in node.keywords if kw.arg and kw.arg.startswith("_")}
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign | ast.AugAssign) else [])
        own |= {t.attr for t in targets if isinstance(t, ast.Attribute)
                and t.attr.startswith("_") and not _is_self(t.value)}
    return own


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def private_reads() -> list[tuple[str, str]]:
    """(module:line, expression) of every ``x._name`` where x is not self or cls and the
    module did not put ``_name`` there itself."""
    found = []
    for where, tree in _modules():
        own = _own_private_names(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__") and not _is_self(node.value)
                    and node.attr not in own and ast.unparse(node) not in STDLIB_PRIVATE):
                found.append((f"{where}:{node.lineno}", ast.unparse(node)))
    return found


def test_no_module_reads_another_objects_private_attribute() -> None:
    assert private_reads() == [], "give the reader a public (read-only) view instead"


def test_no_reader_of_a_target_takes_the_monitors_lock() -> None:
    """Readers see a target only through the frozen view its monitor publishes after each
    poll: the monitor has no public lock and no public mutable state, and no module reaches
    its private lock."""
    from dataclasses import FrozenInstanceError

    from prefixwatch.exporter.config import TargetConfig
    from prefixwatch.exporter.monitor import TargetMonitor, TargetView

    mon = TargetMonitor(TargetConfig("http://127.0.0.1:1/metrics", name="t"), {"1m": 60.0}, 1.0)
    public = {name for name in vars(mon) if not name.startswith("_")}
    assert public == {"target", "name", "windows", "interval"}, "readers use mon.view"
    view = mon.view
    assert isinstance(view, TargetView) and not view.polled
    try:
        view.up = True  # type: ignore[misc]
    except FrozenInstanceError:
        pass
    else:
        raise AssertionError("a target's view must be frozen")
    assert [w for w, expr in private_reads() if expr.endswith("._lock")] == [], (
        "only the monitor itself touches its lock")
