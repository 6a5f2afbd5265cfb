"""dtype `auto` and the float64-on-CUDA guard; per-stage devices from the flags."""

from __future__ import annotations

import pytest
import torch

from omnistream.engine.load_options import LoadOptions, resolve_dtype
from omnistream.request.errors import InvalidRequest


def test_auto_is_bfloat16_on_cuda_and_float32_on_cpu():
    assert LoadOptions().dtype == "auto"
    assert LoadOptions("cpu").torch_dtype() == torch.float32
    assert LoadOptions("cuda").torch_dtype() == torch.bfloat16
    assert LoadOptions("cuda:1").dtype_name == "bfloat16"
    assert resolve_dtype("cpu", "float16") == "float16"


def test_float64_on_cuda_needs_the_debug_flag():
    with pytest.raises(InvalidRequest, match="--allow-float64"):
        LoadOptions("cuda:0", "float64").torch_dtype()
    assert LoadOptions("cuda:0", "float64", allow_float64=True).torch_dtype() == torch.float64
    assert LoadOptions("cpu", "float64").torch_dtype() == torch.float64  # the CPU parity tests
    with pytest.raises(InvalidRequest, match="unknown dtype"):
        LoadOptions("cpu", "float8").torch_dtype()


def test_on_moves_options_to_another_device_and_keeps_the_rest():
    options = LoadOptions("cuda:0", "float64", allow_float64=True)
    assert options.on("cuda:1") == LoadOptions("cuda:1", "float64", allow_float64=True)
    assert options.on(None) is options
