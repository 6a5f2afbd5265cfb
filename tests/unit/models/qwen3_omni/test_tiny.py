"""The tiny checkpoint builder is deterministic, also when it builds twice in one process (the test
session does: the plain and the ending build): parameters transformers leaves as `torch.empty`
once took the previous build's freed memory, and the second checkpoint differed."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import torch

from omnistream.models.qwen3_omni import tiny
from omnistream.models.qwen3_omni.tiny import make_tiny_model


def _digest(directory) -> str:
    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()


def test_two_builds_in_one_process_write_the_same_weights(tmp_path):
    first = _digest(make_tiny_model(tmp_path / "a", answers_end=False))
    # Leave freed memory full of numbers, as a loaded model's would be, before the second build.
    garbage = [torch.randn(1 << 16) for _ in range(64)]
    del garbage
    assert _digest(make_tiny_model(tmp_path / "b", answers_end=False)) == first


def test_parallel_callers_build_once_and_none_reads_it_half_written(tmp_path, monkeypatch):
    """make test's workers ask for the same checkpoint at once: one builds, the others wait for it."""
    directory = tmp_path / "tiny"
    builds: list[float] = []
    found_built: list[bool] = []

    def slow_build(path, **build):
        builds.append(time.monotonic())
        time.sleep(0.3)  # the others arrive while it builds
        path.mkdir(parents=True, exist_ok=True)
        (path / "omnistream_tiny.json").write_text(json.dumps({"builder": tiny.builder_version(), **build}))
        return path

    def caller() -> None:
        built = tiny.built(directory, seed=0)
        found_built.append(tiny.is_current(built))

    monkeypatch.setattr(tiny, "make_tiny_model", slow_build)
    threads = [threading.Thread(target=caller) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(builds) == 1
    assert found_built == [True, True, True]
