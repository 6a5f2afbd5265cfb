"""The CLI modules import without a cycle: `cli` builds the parser from `cli_services`, and what both
need lives in `cli_common`, which imports neither."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CLI_MODULES = ("omnistream.cli.main", "omnistream.cli.services", "omnistream.cli.common")


def _imports(module: str) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    tree = ast.parse((ROOT / (module.replace(".", "/") + ".py")).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_cli_module_imports_one_that_imports_it():
    graph = {m: _imports(m) & set(CLI_MODULES) for m in CLI_MODULES}
    assert graph["omnistream.cli.services"] <= {"omnistream.cli.common"}
    assert graph["omnistream.cli.common"] == set()
    for a in CLI_MODULES:
        for b in graph[a]:
            assert a not in graph[b], f"{a} <-> {b}"


@pytest.mark.parametrize("module", CLI_MODULES)
def test_each_cli_module_imports_alone(module):
    command = [sys.executable, "-c", f"import {module}"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_parser_builds_with_every_command():
    from omnistream.cli.main import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert {"make-tiny-model", "generate", "serve", "up", "bench", "health"} <= set(commands)
