"""What of the vLLM thinker runs without vLLM: its load choice, and where it finds its python.
Its behaviour with vLLM is tested through the real service (tests/integration/test_vllm_thinker.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from omnistream.models.qwen3_omni.thinker import vllm_launch


def test_load_is_native_on_an_accelerator_and_text_on_the_cpu():
    assert vllm_launch.resolve_load("auto", "cpu") == "text"
    assert vllm_launch.resolve_load("auto", "cuda:1") == "native"
    assert vllm_launch.resolve_load("text", "cuda") == "text"
    with pytest.raises(ValueError, match="unknown vllm load"):
        vllm_launch.resolve_load("both", "cpu")


def test_the_default_python_is_the_trees_vllm_environment():
    root = Path(vllm_launch.__file__).resolve().parents[4]
    assert vllm_launch.vllm_python_default() == root / ".venv-vllm" / "bin" / "python"
