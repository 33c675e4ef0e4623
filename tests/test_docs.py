"""The documentation holds together: every relative link in README.md and docs/*.md leads
somewhere (the file exists; an #anchor is a heading of the target, by GitHub's slug rules), and
the map docs/README.md names every page under docs/.

Markdown is read with markdown-it-py (CommonMark), so links inside code blocks and code spans
are not links, as on GitHub."""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def _tokens(path: Path) -> list[Token]:
    return MarkdownIt("commonmark").enable("table").parse(path.read_text())


def _plain(inline: Token) -> str:
    """A heading's text as GitHub renders it: code spans and link texts kept, markup dropped."""
    return "".join(t.content for t in inline.children or () if t.type in ("text", "code_inline"))


def slug(text: str) -> str:
    """GitHub's heading anchor: lower case, every character but letters, digits, spaces, '-'
    and '_' removed, each space a '-'."""
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@cache
def anchors(path: Path) -> frozenset[str]:
    """Every heading's anchor in a page; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: Counter[str] = Counter()
    found = set()
    tokens = _tokens(path)
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            base = slug(_plain(tokens[i + 1]))
            found.add(f"{base}-{seen[base]}" if seen[base] else base)
            seen[base] += 1
    return frozenset(found)


def links(path: Path) -> list[str]:
    """The targets of every link and image in a page (not inside code)."""
    out = []
    for tok in _tokens(path):
        for child in tok.children or ():
            if child.type == "link_open":
                out.append(str(child.attrs["href"]))
            elif child.type == "image":
                out.append(str(child.attrs["src"]))
    return out


def broken(page: Path, href: str, root: Path = ROOT) -> str | None:
    """Why a relative link does not resolve, or None when it does (or is not relative)."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc:
        return None
    target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
    if not target.exists():
        return f"{href}: no such file"
    if root.resolve() not in target.parents:
        return f"{href}: outside the repository"
    if parts.fragment:
        if target.suffix != ".md":
            return f"{href}: an anchor into a file that is not Markdown"
        if unquote(parts.fragment) not in anchors(target):
            return f"{href}: no heading with that anchor in {target.name}"
    return None


def test_slugs_follow_githubs_rules() -> None:
    assert slug("Diagnosis: why is it low") == "diagnosis-why-is-it-low"
    assert slug("The exporter's own endpoint") == "the-exporters-own-endpoint"
    assert slug("KV events: what each engine cached, evicted and had to recompute") == (
        "kv-events-what-each-engine-cached-evicted-and-had-to-recompute")
    assert slug("tier_idle") == "tier_idle"
    assert slug("A quick look without Prometheus") == "a-quick-look-without-prometheus"


def test_broken_links_are_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# One\n\n## One\n\n[a](#one-1) [b](#two) [c](other.md) `[d](code.md)`\n")
    assert anchors(page) == {"one", "one-1"}
    assert links(page) == ["#one-1", "#two", "other.md"]
    assert [broken(page, href, tmp_path) for href in links(page)] == [
        None, "#two: no heading with that anchor in page.md", "other.md: no such file"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = [why for href in links(page) if (why := broken(page, href))]
    assert not problems, f"{page.relative_to(ROOT)}: " + "; ".join(problems)


def test_the_map_lists_every_docs_page() -> None:
    listed = {(DOCS / urlsplit(href).path).resolve() for href in links(DOCS / "README.md")
              if not urlsplit(href).scheme}
    missing = [p.name for p in DOCS.glob("*.md")
               if p.name != "README.md" and p.resolve() not in listed]
    assert not missing, f"docs/README.md does not list {missing}"


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; reference text goes in docs/"
    assert "docs/README.md" in links(ROOT / "README.md")
