"""Shared fixtures: the tiny checkpoint is built once per test session."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from omnistream.qwen3_omni import tiny
from omnistream.qwen3_omni.tiny import make_tiny_model

# Keyed by the builder's source so a change to the tiny model rebuilds it.
_DIGEST = hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest()[:12]
CACHE = Path(__file__).resolve().parent.parent / ".cache" / f"test-tiny-model-{_DIGEST}"


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """A deterministic tiny checkpoint (seed 0), reused across sessions when already built."""
    if not (CACHE / "config.json").exists():
        make_tiny_model(CACHE, seed=0)
    return str(CACHE)


def pytest_configure(config) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_terminal_summary(terminalreporter) -> None:
    """Say it when the vLLM thinker tests were skipped for want of their environment (a plain
    `-q` run shows only a count of skips)."""
    from tests.vllm_env import SKIP_REASON

    skipped = [
        r for r in terminalreporter.stats.get("skipped", []) if SKIP_REASON in str(getattr(r, "longrepr", ""))
    ]
    if skipped:
        terminalreporter.write_line(f"{len(skipped)} skipped: {SKIP_REASON}")


@pytest.fixture(scope="session")
def media_expected(tiny_model_dir):
    """The transformers reference's outputs for tests/media_samples.py's conversations (computed
    once per session: the pipeline and the service tests compare against the same run)."""
    from tests.media_reference import expected_outputs

    return expected_outputs(tiny_model_dir)
