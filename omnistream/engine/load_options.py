"""Where and in what precision a stage's weights live: the one load setting every family shares.

Kept out of the family packages so the CLI, the services and the pipeline can name a device and a
dtype without depending on any model; torch is imported only when a dtype is resolved, so parsing
the flags stays cheap (the CLI imports this before its lifeline is bound, see lifeline.py).

The default dtype is `auto`: bfloat16 on an accelerator (the checkpoint's own precision: float32
there doubles the memory, ~118 GiB for the 30B thinker alone), float32 on the CPU (where bfloat16
matmuls are slow and the reference parity tests run). float64 on CUDA is a debugging tool (parity
against a CPU reference) and is refused unless `allow_float64` says it is meant.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16", "float64")
AUTO_DTYPE = "auto"
DTYPE_CHOICES = (AUTO_DTYPE, *DTYPE_NAMES)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def is_accelerator(device: str) -> bool:
    """True for a device that is not the host CPU (cuda, cuda:N, ...)."""
    return not str(device).startswith("cpu")


def resolve_dtype(device: str, dtype: str = AUTO_DTYPE, allow_float64: bool = False) -> str:
    """The concrete dtype name for `dtype` on `device`; InvalidRequest for an unknown name or for
    float64 on an accelerator without `allow_float64`."""
    from omnistream.request.errors import InvalidRequest  # grpc: not at import time, see above

    if dtype == AUTO_DTYPE:
        return "bfloat16" if is_accelerator(device) else "float32"
    if dtype not in DTYPE_NAMES:
        raise InvalidRequest(f"unknown dtype {dtype!r}; choose from {list(DTYPE_CHOICES)}", field="dtype")
    if dtype == "float64" and is_accelerator(device) and not allow_float64:
        raise InvalidRequest(
            f"float64 on {device} is a debugging mode (8 bytes a weight, ~4x bfloat16's memory, slow "
            "kernels); pass --allow-float64 if that is what you want, or use --dtype auto (bfloat16)",
            field="dtype",
        )
    return dtype


@dataclass(frozen=True)
class LoadOptions:
    device: str = "cpu"
    dtype: str = AUTO_DTYPE
    allow_float64: bool = False
    # The talker replays CUDA graphs of its frame's steps (omnistream/models/qwen3_omni/talker/frame.py;
    # without static frames, of the code predictor's: talker/code_predictor.py). None (the default): on
    # for a CUDA device, off elsewhere; True off CUDA: the engine refuses to start.
    cuda_graphs: bool | None = None
    # The talker runs each frame as two fixed-shape, graph-capturable steps
    # (omnistream/models/qwen3_omni/talker/frame.py), the same codes as the eager frame on the CPU, where
    # it is also a little faster (docs/benchmarks.md); with graphs they are captured too.
    static_frames: bool = True
    # The thinker's engine: "transformers" (ours, every modality) or "vllm" (vLLM's async engine,
    # text only; needs the vLLM environment, `make setup-vllm`). Other stages have one engine.
    backend: str = "transformers"
    # With backend "vllm": what vLLM loads ("auto", "text", "native"; see thinker/vllm_engine.py).
    vllm_load: str = "auto"

    @property
    def graphs(self) -> bool:
        """Whether CUDA graphs are used: as asked, or (not asked) whenever the device is CUDA."""
        if self.cuda_graphs is None:
            return self.device.split(":")[0] == "cuda"
        return self.cuda_graphs

    @property
    def dtype_name(self) -> str:
        """The resolved dtype name (`auto` decided for this device)."""
        return resolve_dtype(self.device, self.dtype, self.allow_float64)

    def torch_dtype(self) -> torch.dtype:
        name = self.dtype_name
        import torch

        dtype: torch.dtype = getattr(torch, name)
        return dtype

    def on(self, device: str | None) -> LoadOptions:
        """The same options on another device (None: this one): one stage's options."""
        if device is None or device == self.device:
            return self
        return dataclasses.replace(self, device=device)


DTYPE_HELP = "auto (default): bfloat16 on cuda, float32 on cpu"


def add_dtype_arguments(p: argparse.ArgumentParser) -> None:
    """`--dtype` and `--allow-float64`, the same for every command that loads a stage."""
    p.add_argument("--dtype", default=AUTO_DTYPE, choices=list(DTYPE_CHOICES), help=DTYPE_HELP)
    p.add_argument(
        "--allow-float64",
        action="store_true",
        help="permit --dtype float64 on cuda (a debugging mode: parity against a CPU reference)",
    )


STAGE_NAMES = ("thinker", "talker", "code2wav")


def add_stage_device_arguments(p: argparse.ArgumentParser) -> None:
    """`--thinker-device` etc.: one device per stage, each defaulting to `--device`."""
    for stage in STAGE_NAMES:
        p.add_argument(
            f"--{stage}-device", default=None, help=f"device of the {stage} (default: --device), e.g. cuda:1"
        )


def stage_devices(args: argparse.Namespace) -> dict[str, str]:
    """Each stage's device from parsed `--device` and `--<stage>-device` flags."""
    return {stage: getattr(args, f"{stage}_device", None) or args.device for stage in STAGE_NAMES}


# Prompt positions a thinker or talker prefills per engine step (all prefills of that step together).
# A long prompt then holds the running requests' decode for one such piece per step, not for its
# whole length. Lives here because this is the torch-free module the CLI, the services and the
# pipeline all import.
DEFAULT_PREFILL_CHUNK = 512

# Requests a stage engine batches (KV slots, one step's rows) unless told otherwise: the one default
# the engines, the family, the pipeline and `omnistream serve --max-batch` share.
DEFAULT_MAX_BATCH = 16
