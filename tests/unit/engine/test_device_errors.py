"""Which errors poison the device: CUDA faults do, out-of-memory and ordinary errors do not."""

from __future__ import annotations

import pytest
import torch

from omnistream.engine.device_errors import poisons_device


@pytest.mark.parametrize(
    "message",
    [
        "CUDA error: an illegal memory access was encountered",
        "CUDA error: device-side assert triggered\nCompile with `TORCH_USE_CUDA_DSA`",
        "CUDA error: unspecified launch failure",
        "CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx`",
    ],
)
def test_cuda_faults_poison(message):
    assert poisons_device(RuntimeError(message))


def test_accelerator_error_poisons_and_is_found_behind_a_wrapper():
    accelerator = getattr(torch, "AcceleratorError", None)
    if accelerator is not None:
        assert poisons_device(accelerator("whatever the runtime says"))
        assert not poisons_device(accelerator("CUDA error: out of memory"))  # per allocation: not sticky
    try:
        try:
            raise RuntimeError("CUDA error: misaligned address")
        except RuntimeError as inner:
            raise ValueError("while sampling") from inner
    except ValueError as outer:
        assert poisons_device(outer)


@pytest.mark.parametrize(
    "error",
    [
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: out of memory"),
        RuntimeError("mat1 and mat2 shapes cannot be multiplied (1x4 and 8x2)"),
        ValueError("CUDA error in a user's text is no fault"),  # not a RuntimeError
    ],
)
def test_other_errors_do_not(error):
    assert not poisons_device(error)
