"""Which errors poison the device, so the stage must stop instead of failing one request.

After an asynchronous CUDA fault (a device-side assert, an illegal address, a launch failure) the
CUDA context is unusable: every later kernel raises the same error. Failing the one request whose
step raised (what `Engine._step_failed` does for an ordinary error) would leave a stage that fails
every request while its health check says SERVING. The only recovery is a new process, so such an
error ends the stage: its requests fail, health goes NOT_SERVING, it exits non-zero, and the
orchestrator (Kubernetes, compose, `omnistream up`) restarts it.
"""

from __future__ import annotations

import torch

# Lower-case fragments of the messages torch gives CUDA faults that leave the context unusable.
POISON_MARKERS = (
    "cuda error",
    "device-side assert",
    "illegal memory access",
    "illegal instruction",
    "unspecified launch failure",
    "cublas_status_execution_failed",
    "cudnn_status_execution_failed",
    "misaligned address",
)

# torch >= 2.8 raises this for accelerator runtime failures; absent on older versions.
_ACCELERATOR_ERROR: type[BaseException] | None = getattr(torch, "AcceleratorError", None)


def poisons_device(error: BaseException) -> bool:
    """True when `error` (or what it was raised from) is a CUDA fault that poisons the context.

    A CUDA out-of-memory error is not one: it is per-allocation, the context stays usable, and the
    request that hit it is failed alone as usual."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        message = str(current).lower()
        if isinstance(current, torch.cuda.OutOfMemoryError) or "out of memory" in message:
            return False  # also an AcceleratorError "CUDA error: out of memory" (e.g. a cuBLAS workspace)
        if _ACCELERATOR_ERROR is not None and isinstance(current, _ACCELERATOR_ERROR):
            return True
        if isinstance(current, RuntimeError) and any(m in message for m in POISON_MARKERS):
            return True
        current = current.__cause__ or current.__context__
    return False
