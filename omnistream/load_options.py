"""Where and in what precision a stage's weights live: the one load setting every family shares.

Kept out of the family packages so the CLI, the services and the pipeline can name a device and a
dtype without depending on any model; torch is imported only when a dtype is resolved, so parsing
the flags stays cheap (the CLI imports this before its lifeline is bound, see lifeline.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class LoadOptions:
    device: str = "cpu"
    dtype: str = "float32"
    # The talker's code predictor replays CUDA graphs (omnistream/qwen3_omni/code_predictor.py);
    # CUDA devices only: asked for elsewhere, the engine refuses to start.
    cuda_graphs: bool = False

    def torch_dtype(self) -> torch.dtype:
        if self.dtype not in DTYPE_NAMES:
            from omnistream.errors import InvalidRequest  # grpc: not at import time, see above

            raise InvalidRequest(f"unknown dtype {self.dtype!r}; choose from {sorted(DTYPE_NAMES)}")
        import torch

        return getattr(torch, self.dtype)


# Prompt positions a thinker or talker prefills per engine step (all prefills of that step together).
# A long prompt then holds the running requests' decode for one such piece per step, not for its
# whole length. Lives here because this is the torch-free module the CLI, the services and the
# pipeline all import.
DEFAULT_PREFILL_CHUNK = 512
