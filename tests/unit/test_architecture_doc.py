"""docs/architecture.md matches the tree: every path it names exists, and every package is in it.

The doc is where a newcomer looks for a concern's home; a move that forgets it fails here. The path
reading is the doc tests' own (tests/doc_paths.py, which tests/unit/test_docs.py applies to every page).
"""

from __future__ import annotations

from tests.doc_paths import ROOT, missing_paths, named_paths

DOC = ROOT / "docs" / "architecture.md"


def _packages() -> list[str]:
    packages = []
    for top in ("omnistream", "gateway", "services"):
        for init in sorted((ROOT / top).rglob("__init__.py")):
            package = init.parent.relative_to(ROOT).as_posix()
            if package.startswith("omnistream/proto"):
                continue  # generated; the doc names it once, as omnistream/proto/
            packages.append(package)
    return packages


def test_every_path_the_doc_names_exists():
    missing = missing_paths(DOC.read_text())
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_is_in_the_doc():
    named = set(named_paths(DOC.read_text()))
    absent = [p for p in _packages() if not any(n == p + "/" or n.startswith(p + "/") for n in named)]
    assert not absent, f"packages docs/architecture.md does not name (as path/...): {absent}"
