"""Helpers for checking the deployment files: the validators run from this venv's bin directory."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def tool(name: str) -> Path:
    """A validator installed with the dev extras; skip (saying how to get it) when it is missing."""
    path = BIN / name
    if not path.exists():
        pytest.skip(
            f"{name} is not installed in {BIN}: run `{BIN / 'pip'} install -e '.[dev]'` (or make test)"
        )
    return path


def run(*cmd: str | Path, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs)


def cli_args(argv: list[str], env: dict[str, str] | None = None):
    """Parse a service command line with the real `omnistream` parser (fails on an unknown flag),
    as it would run with `env` (the container's environment) on top of ours."""
    from omnistream.cli.main import build_parser

    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        return build_parser().parse_args([str(a) for a in argv])
    except SystemExit as exc:
        raise AssertionError(f"`omnistream {shlex.join(map(str, argv))}` does not parse") from exc
    finally:
        os.environ.clear()
        os.environ.update(saved)


def flag(argv: list[str], name: str) -> str:
    argv = [str(a) for a in argv]
    return argv[argv.index(name) + 1]
