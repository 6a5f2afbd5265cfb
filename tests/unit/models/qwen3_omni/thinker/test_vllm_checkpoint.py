"""The thinker's text model as a Qwen3MoeForCausalLM directory (thinker/vllm_checkpoint.py).

Three checks: the conversion is deterministic and cached by its key; the converted model (its
widened heads included) computes the thinker's logits, read with transformers' own Qwen3-MoE in
the project's environment; and vLLM, loading it, makes the transformers thinker's greedy tokens,
alone and in one batch of prompts of different lengths (needs the vLLM environment: a process,
so in tests/integration/test_vllm_checkpoint.py).
"""

from __future__ import annotations

import json

import pytest
import torch

from omnistream.engine.load_options import LoadOptions
from omnistream.models.qwen3_omni.checkpoint import load_stage
from omnistream.models.qwen3_omni.thinker import vllm_checkpoint
from tests.vllm_reference import prompts


def test_conversion_is_deterministic_and_cached(tiny_model_dir, tmp_path):
    a = vllm_checkpoint.convert(tiny_model_dir, tmp_path / "a")
    b = vllm_checkpoint.convert(tiny_model_dir, tmp_path / "b")
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    config = json.loads((a / "config.json").read_text())
    assert config["architectures"] == ["Qwen3MoeForCausalLM"]
    assert config["head_dim"] == 32  # the tiny model's 16, widened for vLLM's CPU kernels
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    before = (a / "model.safetensors").stat().st_mtime_ns
    assert vllm_checkpoint.ensure_converted(tiny_model_dir, a) == a
    assert (a / "model.safetensors").stat().st_mtime_ns == before  # reused, not rewritten
    (a / vllm_checkpoint.STAMP).write_text(json.dumps({"key": "an older converter"}))
    assert not vllm_checkpoint.is_current(a, tiny_model_dir)


def test_default_output_sits_beside_the_checkpoint(tmp_path):
    assert vllm_checkpoint.default_output(tmp_path / "tiny") == tmp_path / "tiny-vllm-thinker"


def test_refuses_a_checkpoint_of_another_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="not a Qwen3-Omni checkpoint"):
        vllm_checkpoint.convert(tmp_path, tmp_path / "out")


def test_converted_model_computes_the_thinkers_logits(tiny_model_dir, tmp_path):
    """transformers' Qwen3MoeForCausalLM on the converted directory (head_dim 32, plain RoPE) vs the
    Qwen3-Omni thinker (head_dim 16, M-RoPE at equal positions), text prompts, float64."""
    from transformers import AutoModelForCausalLM

    converted = vllm_checkpoint.convert(tiny_model_dir, tmp_path / "converted")
    options = LoadOptions(dtype="float64")
    thinker = load_stage("thinker", tiny_model_dir, options).thinker
    plain = AutoModelForCausalLM.from_pretrained(
        str(converted), dtype=torch.float64, experts_implementation="eager"
    ).eval()
    for ids in prompts(tiny_model_dir):
        x = torch.tensor([ids])
        with torch.no_grad():
            want = thinker(input_ids=x).logits
            got = plain(input_ids=x).logits
        # The widened heads compute the same attention (vllm_checkpoint.py); only rounding differs,
        # and both models take their attention softmax in float32, where it shows (~2e-8 here).
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-7)
