"""The repository paths a Markdown page names, and the pages' relative links: what the doc tests
hold to the tree, so that a move or a rename that forgets a page fails a test instead of a reader."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOTS = ("omnistream", "gateway", "services", "tests", "tools", "protos", "deploy", "docs", "examples")
PLACEHOLDERS = {"<stage>": ("thinker", "talker", "code2wav")}
_PATH = re.compile(r"(?<![\w/.:-])(?:" + "|".join(ROOTS) + r")/[\w./{},*<>-]*")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def expand(path: str) -> list[str]:
    """`a/{b,c}.py` -> a/b.py, a/c.py; `services/<stage>/` -> one per stage."""
    for mark, values in PLACEHOLDERS.items():
        if mark in path:
            return [p for v in values for p in expand(path.replace(mark, v))]
    brace = re.search(r"\{([^{}]*)\}", path)
    if brace:
        return [
            p
            for option in brace.group(1).split(",")
            for p in expand(path[: brace.start()] + option + path[brace.end() :])
        ]
    return [path]


def named_paths(text: str) -> list[str]:
    """Every path under one of ROOTS that `text` names (as `tools/gpu-smoke` or `gateway/realtime/`),
    braces and placeholders expanded; `<family>` stands for a family that does not exist yet."""
    found = []
    for match in _PATH.finditer(text):
        path = match.group(0).rstrip(".,:")
        if "<family>" in path:
            continue
        found.extend(expand(path))
    return found


def missing_paths(text: str) -> list[str]:
    """The paths `text` names that the tree does not hold (globs count when they match anything)."""
    return sorted({p for p in named_paths(text) if not any(itertools.islice(ROOT.glob(p.rstrip("/")), 1))})


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(h) for h in _HEADING.findall(_without_code(page.read_text(encoding="utf-8")))}


def _without_code(text: str) -> str:
    """The page without its fenced code blocks (a `# comment` there is no heading, a `](x)` no link)."""
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def relative_links(page: Path) -> list[str]:
    """The page's links that point into the repository (not to a URL)."""
    links = _LINK.findall(_without_code(page.read_text(encoding="utf-8")))
    return [link for link in links if not re.match(r"^[a-z]+:", link)]


def broken_links(page: Path) -> list[str]:
    """Relative links of `page` whose file is absent or whose `#anchor` is no heading of it."""
    broken = []
    for link in relative_links(page):
        target, _, fragment = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists() or (fragment and path.suffix == ".md" and fragment not in anchors(path)):
            broken.append(link)
    return broken
