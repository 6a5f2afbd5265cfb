"""Shared fixtures (the tiny checkpoints are built once, by one of the parallel workers) and the test tiers.

The tiers are the folders, each with its marker, so `-m unit` selects what `make check` runs
without a list to keep: tests/unit/ runs in-process (no stage processes, no browser, no apt
package, milliseconds to a few seconds a test), tests/reference/ runs the model in-process against
the transformers reference (whole generations, real-structured decodes: seconds a test),
tests/integration/ runs real services on loopback ports and what needs a Debian package (espeak-ng,
chromium) or a second environment (.venv-vllm), tests/deploy/ checks the deployment files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnistream.models.qwen3_omni import tiny

# Keyed by the builder's fingerprint (its sources) so a change to the tiny model rebuilds it.
_CACHES = Path(__file__).resolve().parent.parent / ".cache"
CACHE = _CACHES / f"test-tiny-model-{tiny.builder_version()}"
ENDING_CACHE = _CACHES / f"test-tiny-model-{tiny.builder_version()}-ending"
OTHER_CACHE = _CACHES / f"test-tiny-model-{tiny.builder_version()}-seed7-h96"


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """A deterministic tiny checkpoint (seed 0) whose answers run to `max_tokens` and
    `max_audio_frames` (`answers_end=False`): the fixed lengths most tests count on. Reused across
    sessions when already built."""
    return str(tiny.built(CACHE, seed=0, answers_end=False))


@pytest.fixture(scope="session")
def ending_tiny_model_dir() -> str:
    """The tiny checkpoint `make run` serves (seed 0, the default build): its answers end by
    themselves, in text and in speech (omnistream/models/qwen3_omni/tiny_answer_end.py)."""
    return str(tiny.built(ENDING_CACHE, seed=0))


@pytest.fixture(scope="session")
def other_tiny_model_dir() -> str:
    """A second seed and size (tests/reference_runs.py OTHER_BUILD), ending: the reference tests'
    check that parity is no accident of seed 0's weights."""
    from tests.reference_runs import OTHER_BUILD

    return str(tiny.built(OTHER_CACHE, **OTHER_BUILD))


@pytest.fixture(scope="session")
def real_shaped_model_dir() -> str:
    """The tiny checkpoint with the real model's 5-layer code predictor and experts' routing (128
    experts, top-8 thinker, top-6 talker; ending)."""
    from omnistream.bench.op_counts import real_shaped_model

    return real_shaped_model(Path(f"{CACHE}-real-shaped"))


@pytest.fixture(scope="session")
def build_dirs(request):
    """name -> checkpoint directory for tests/reference_runs.py's BUILDS, each built on first use."""
    fixtures = {
        "never-ending": "tiny_model_dir",
        "ending": "ending_tiny_model_dir",
        "seed7-h96": "other_tiny_model_dir",
        "real-shaped": "real_shaped_model_dir",
    }
    return lambda name: request.getfixturevalue(fixtures[name])


@pytest.fixture(scope="session")
def references(build_dirs):
    """name -> the transformers reference on that build (tests/reference_runs.py), loaded once."""
    from tests.reference_runs import Reference

    loaded: dict = {}

    def reference(name: str):
        if name not in loaded:
            loaded[name] = Reference(build_dirs(name))
        return loaded[name]

    return reference


TIERS = ("unit", "reference", "integration", "deploy")  # the folders under tests/, each its own marker
_TESTS = Path(__file__).resolve().parent


def pytest_configure(config) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# make test's workers take whole files in this order (pytest-xdist --dist loadfile): the tiers of
# long files first, so that the many short unit files fill the end instead of one worker still
# running a minute-long stack test while the other has nothing left.
_FIRST = ("integration", "deploy", "reference", "unit")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the folder it is in (registered in pyproject.toml), and order
    the tiers as `_FIRST` (a stable sort: the order within a tier stays)."""
    tiers = {}
    for item in items:
        tier = tiers[item.nodeid] = tier_of(Path(item.fspath))
        if tier is not None:
            item.add_marker(tier)
    items.sort(
        key=lambda item: _FIRST.index(tiers[item.nodeid]) if tiers[item.nodeid] in _FIRST else len(_FIRST)
    )


def tier_of(path: Path) -> str | None:
    """`unit`, `integration` or `deploy` for a test file under that folder of tests/, else None."""
    try:
        folder = path.resolve().relative_to(_TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return folder if folder in TIERS else None


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
