"""The fixed-shape experts: equal to transformers' eager experts, never waiting for the device, and
chosen where transformers' own kernels would wait.

The blocks are transformers' own Qwen3-Omni thinker and talker MoE blocks at the real routing (128
experts, top-8 and top-6) and the tiny one (4, top-2), at small widths, with random weights."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3OmniMoeConfig
from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as qwen

from omnistream.models import moe_experts
from omnistream.models.moe_experts import FIXED, FIXED_MAX_ROWS, experts_for
from tests.moe_syncs import MoeSyncs

moe_experts.register()
ROUTINGS = [(4, 2), (128, 8), (128, 6)]
ROWS = [1, 3, 5, 16, 64, FIXED_MAX_ROWS + 72]  # pairs, pairs/every expert, every expert, a prefill
TOLERANCE = {torch.float64: 1e-12, torch.float32: 2e-5}


def _block(kind: str, experts: int, top_k: int, dtype: torch.dtype, seed: int = 0) -> torch.nn.Module:
    config = Qwen3OmniMoeConfig()
    text = (config.thinker_config if kind == "thinker" else config.talker_config).text_config
    text.hidden_size, text.moe_intermediate_size, text.shared_expert_intermediate_size = 32, 24, 16
    text.num_experts, text.num_experts_per_tok = experts, top_k
    cls = (
        qwen.Qwen3OmniMoeThinkerTextSparseMoeBlock
        if kind == "thinker"
        else qwen.Qwen3OmniMoeTalkerTextSparseMoeBlock
    )
    torch.manual_seed(seed)
    block = cls(text).to(dtype).eval()
    for parameter in block.parameters():
        torch.nn.init.normal_(parameter, std=0.2)
    block.config = text
    return block


def _run(block: torch.nn.Module, implementation: str, x: torch.Tensor) -> torch.Tensor:
    block.config._experts_implementation = implementation
    with torch.inference_mode():
        return block(x)


@pytest.mark.parametrize("kind", ["thinker", "talker"])
@pytest.mark.parametrize("routing", ROUTINGS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fixed_experts_equal_eager(kind, routing, dtype):
    block = _block(kind, *routing, dtype)
    for rows in ROWS:
        x = torch.randn(1, rows, 32, dtype=dtype)
        eager, fixed = _run(block, "eager", x), _run(block, FIXED, x)
        assert fixed.shape == eager.shape
        assert torch.allclose(fixed, eager, rtol=0, atol=TOLERANCE[dtype]), (
            rows,
            (fixed - eager).abs().max(),
        )


def test_a_row_gets_the_same_output_in_any_batch():
    """Fixed shapes are the batch's, so a row must not depend on its neighbours (only rounding)."""
    block = _block("thinker", 128, 8, torch.float64)
    x = torch.randn(1, 16, 32, dtype=torch.float64)
    whole = _run(block, FIXED, x)
    for row in (0, 7, 15):
        alone = _run(block, FIXED, x[:, row : row + 1])
        assert torch.allclose(alone[0, 0], whole[0, row], rtol=0, atol=1e-13)


@pytest.mark.parametrize("kind", ["thinker", "talker"])
@pytest.mark.parametrize("rows", [1, 16])
def test_fixed_experts_make_no_host_sync(kind, rows):
    block = _block(kind, 128, 8 if kind == "thinker" else 6, torch.float32)
    x = torch.randn(1, rows, 32)
    block.config._experts_implementation = FIXED
    with torch.inference_mode(), MoeSyncs(block) as syncs:
        block(x)
    assert syncs.blocks == 1
    assert not syncs.found, dict(syncs.found)


def test_the_recorder_finds_eager_and_grouped_mm_waits():
    """The recorder is what the engine tests trust: it must see eager's loop and grouped_mm's kernel."""
    block = _block("thinker", 128, 8, torch.float32)
    x = torch.randn(1, 16, 32)
    found = {}
    for implementation in ("eager", "grouped_mm"):
        block.config._experts_implementation = implementation
        with torch.inference_mode(), MoeSyncs(block) as syncs:
            block(x)
        found[implementation] = set(syncs.found)
    assert {"aten.nonzero", "Tensor.__bool__"} <= found["eager"]
    assert found["grouped_mm"] == {"aten._grouped_mm"}


def test_choice_waits_for_no_device(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    dims = (2048, 768)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert experts_for("auto", cuda, torch.bfloat16, dims) == "grouped_mm"  # CUTLASS: sync-free
    assert experts_for("auto", cuda, torch.bfloat16, (2048, 762)) == FIXED  # unaligned: fallback
    assert experts_for("auto", cuda, torch.float32, dims) == FIXED  # the fallback copies offsets
    assert experts_for("auto", cuda, torch.float64, dims) == FIXED
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert experts_for("auto", cuda, torch.bfloat16, dims) == FIXED  # no CUTLASS grouped GEMM on SM80
    assert experts_for("auto", cpu, torch.float32, dims) == "grouped_mm"  # the host waits for nothing
    assert experts_for("auto", cpu, torch.float64, dims) == FIXED  # grouped_mm refuses float64
    assert experts_for("fixed", cpu, torch.float32, dims) == FIXED
    assert experts_for("eager", cuda, torch.bfloat16, dims) == "eager"
