"""The tiny checkpoint builder is deterministic, also when it builds twice in one process (the test
session does: the plain and the ending build): parameters transformers leaves as `torch.empty`
once took the previous build's freed memory, and the second checkpoint differed."""

from __future__ import annotations

import hashlib

import torch

from omnistream.models.qwen3_omni.tiny import make_tiny_model


def _digest(directory) -> str:
    return hashlib.sha256((directory / "model.safetensors").read_bytes()).hexdigest()


def test_two_builds_in_one_process_write_the_same_weights(tmp_path):
    first = _digest(make_tiny_model(tmp_path / "a", answers_end=False))
    # Leave freed memory full of numbers, as a loaded model's would be, before the second build.
    garbage = [torch.randn(1 << 16) for _ in range(64)]
    del garbage
    assert _digest(make_tiny_model(tmp_path / "b", answers_end=False)) == first
