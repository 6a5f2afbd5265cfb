"""Shared fixtures: the tiny checkpoints are built once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnistream.models.qwen3_omni import tiny
from omnistream.models.qwen3_omni.tiny import make_tiny_model

# Keyed by the builder's fingerprint (its sources) so a change to the tiny model rebuilds it.
_CACHES = Path(__file__).resolve().parent.parent / ".cache"
CACHE = _CACHES / f"test-tiny-model-{tiny.builder_version()}"
ENDING_CACHE = _CACHES / f"test-tiny-model-{tiny.builder_version()}-ending"


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """A deterministic tiny checkpoint (seed 0) whose answers run to `max_tokens` and
    `max_audio_frames` (`answers_end=False`): the fixed lengths most tests count on. Reused across
    sessions when already built."""
    if not (CACHE / "config.json").exists():
        make_tiny_model(CACHE, seed=0, answers_end=False)
    return str(CACHE)


@pytest.fixture(scope="session")
def ending_tiny_model_dir() -> str:
    """The tiny checkpoint `make run` serves (seed 0, the default build): its answers end by
    themselves, in text and in speech (omnistream/models/qwen3_omni/tiny_answer_end.py)."""
    if not (ENDING_CACHE / "config.json").exists():
        make_tiny_model(ENDING_CACHE, seed=0)
    return str(ENDING_CACHE)


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
