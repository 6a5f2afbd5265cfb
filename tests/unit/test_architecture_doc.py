"""docs/architecture.md matches the tree: every path it names exists, and every package is in it.

The doc is where a newcomer looks for a concern's home; a move that forgets it fails here.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
ROOTS = ("omnistream", "gateway", "services", "tests", "tools", "protos", "deploy", "docs")
PLACEHOLDERS = {"<stage>": ("thinker", "talker", "code2wav")}
_PATH = re.compile(r"(?<![\w/.-])(?:" + "|".join(ROOTS) + r")/[\w./{},*<>-]*")


def _expand(path: str) -> list[str]:
    """`a/{b,c}.py` -> a/b.py, a/c.py; `services/<stage>/` -> one per stage."""
    for mark, values in PLACEHOLDERS.items():
        if mark in path:
            return [p for v in values for p in _expand(path.replace(mark, v))]
    brace = re.search(r"\{([^{}]*)\}", path)
    if brace:
        return [
            p
            for option in brace.group(1).split(",")
            for p in _expand(path[: brace.start()] + option + path[brace.end() :])
        ]
    return [path]


def _named_paths() -> list[str]:
    found = []
    for match in _PATH.finditer(DOC.read_text()):
        path = match.group(0).rstrip(".,")
        if "<family>" in path:
            continue  # a family that does not exist yet
        found.extend(_expand(path))
    return found


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
    missing = sorted(
        {path for path in _named_paths() if not any(itertools.islice(ROOT.glob(path.rstrip("/")), 1))}
    )
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_every_package_is_in_the_doc():
    named = set(_named_paths())
    absent = [p for p in _packages() if not any(n == p + "/" or n.startswith(p + "/") for n in named)]
    assert not absent, f"packages docs/architecture.md does not name (as path/...): {absent}"
