"""README.md and every page under docs/ against the tree: the paths they name exist, their links
resolve (anchors included), the README links every page and stays a short front door.

docs/architecture.md has its own test besides (tests/unit/test_architecture_doc.py: every package
is in it); this one holds all the pages to the same rule, so a move that forgets one fails here."""

from __future__ import annotations

import pytest

from tests.doc_paths import ROOT, broken_links, missing_paths, relative_links

README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 250


def test_the_docs_pages_exist():
    names = {page.name for page in PAGES}
    expected = {"serving.md", "realtime.md", "deployment.md", "gpu.md", "vllm-thinker.md", "reliability.md"}
    assert expected | {"benchmarks.md", "architecture.md"} <= names


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_path_a_page_names_exists(page):
    missing = missing_paths(page.read_text(encoding="utf-8"))
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)} has links to nothing: {broken}"


def test_the_readme_links_every_page():
    linked = {link.partition("#")[0] for link in relative_links(README)}
    unlinked = [page.name for page in PAGES if f"docs/{page.name}" not in linked]
    assert not unlinked, f"README.md does not link these docs pages: {unlinked}"


def test_the_readme_is_short():
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move detail into a docs/ page"
