"""Where and in what precision a stage's weights live: the one load setting every family shares.

Kept out of the family packages so the CLI, the services and the pipeline can name a device and a
dtype without depending on any model; torch is imported only when a dtype is resolved, so parsing
the flags stays cheap (the CLI imports this before its lifeline is bound, see lifeline.py).

The default dtype is `auto`: bfloat16 on an accelerator (the checkpoint's own precision: float32
there doubles the memory, ~118 GiB for the 30B thinker alone), float32 on the CPU (where bfloat16
matmuls are slow and the reference parity tests run). float64 on CUDA is a debugging tool (parity
against a CPU reference) and is refused unless `allow_float64` says it is meant.

The load settings are declared here once, as `setting(...)` fields (their flags are generated from
them): `DeviceSettings` every stage's, `GraphSettings` the talker's and Code2Wav's (CUDA graphs),
`TalkerLoadSettings` and `ThinkerLoadSettings` one stage's.
A stage's engine settings (omnistream/engine/settings.py) extend them; `LoadOptions` holds them all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Self

from omnistream.engine.setting_field import setting

if TYPE_CHECKING:
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


DTYPE_HELP = "auto (default): bfloat16 on cuda, float32 on cpu"
ALLOW_FLOAT64_HELP = "permit --dtype float64 on cuda (a debugging mode: parity against a CPU reference)"


@dataclass(frozen=True)
class DeviceSettings:
    """Where a stage's weights live and in what precision: the load settings every stage takes.
    (`--dtype` and `--allow-float64` are added by `add_dtype_arguments`, the same for every command.)"""

    device: str = setting("cpu", help="cpu, cuda or cuda:N")
    dtype: str = setting(AUTO_DTYPE, help=DTYPE_HELP)
    allow_float64: bool = setting(False, help=ALLOW_FLOAT64_HELP)

    @property
    def dtype_name(self) -> str:
        """The resolved dtype name (`auto` decided for this device)."""
        return resolve_dtype(self.device, self.dtype, self.allow_float64)

    def torch_dtype(self) -> torch.dtype:
        name = self.dtype_name
        import torch

        dtype: torch.dtype = getattr(torch, name)
        return dtype

    def on(self, device: str | None) -> Self:
        """The same settings on another device (None: this one): one stage's."""
        if device is None or device == self.device:
            return self
        return dataclasses.replace(self, device=device)


@dataclass(frozen=True)
class ExpertsLoadSettings(DeviceSettings):
    """How a mixture-of-experts stage (the thinker, the talker) runs its experts."""

    # auto: omnistream/models/moe_experts.py `experts_for`, sync-free on every device.
    experts: Literal["auto", "fixed", "grouped_mm", "eager"] = setting(
        "auto",
        help="the MoE experts kernel: fixed (fixed shapes, routing kept on the device: no host sync, "
        "CUDA-graph capturable), grouped_mm (transformers' sparse kernel: sync-free only in bfloat16 on "
        "an SM90/SM100 GPU), eager (transformers' per-expert loop, the reference), or auto: grouped_mm "
        "where it is sync-free and on the CPU (no device to wait for), fixed elsewhere and in float64",
    )


@dataclass(frozen=True)
class GraphSettings(DeviceSettings):
    """Whether a stage replays CUDA graphs of its fixed-shape steps (`serve talker`, `serve code2wav`)."""

    # The talker replays CUDA graphs of its frame's steps (omnistream/models/qwen3_omni/talker/frame.py;
    # without static frames, of the code predictor's: talker/code_predictor.py), Code2Wav of its
    # streaming step (code2wav/static_step.py); both through omnistream/engine/step_graphs.py.
    cuda_graphs: bool | None = setting(
        None,
        shown="on for a CUDA --device, off elsewhere",
        help="capture the stage's fixed-shape steps as CUDA graphs, once per batch bucket, and replay "
        "them: the talker frame's two steps (with --no-static-frames: the code predictor's 15; per KV "
        "width too), Code2Wav's streaming step (per window-length bucket too): a few replays per step "
        "instead of hundreds or thousands of launches. Each graph is checked against its eager run when "
        "captured; one that differs or fails to capture runs eagerly (logged). Asked for off CUDA: refused",
    )

    @property
    def graphs(self) -> bool:
        """Whether CUDA graphs are used: as asked, or (not asked) whenever the device is CUDA."""
        if self.cuda_graphs is None:
            return self.device.split(":")[0] == "cuda"
        return self.cuda_graphs


@dataclass(frozen=True)
class TalkerLoadSettings(ExpertsLoadSettings, GraphSettings):
    """How the talker runs its frames (`serve talker` only)."""

    # Each frame as two fixed-shape, graph-capturable steps (talker/frame.py), the same codes as the
    # eager frame; on the CPU also a little faster (docs/benchmarks.md).
    static_frames: bool = setting(
        True,
        help="run each talker frame as two fixed-shape steps (the code predictor's 15 codebooks, "
        "the talker's decode step, each with its sampling); the same codes as the eager frame "
        "(--no-static-frames: the eager frame, dynamic shapes)",
    )


@dataclass(frozen=True)
class ThinkerLoadSettings(ExpertsLoadSettings):
    """Which engine runs the thinker (`serve thinker` only)."""

    backend: Literal["transformers", "vllm"] = setting(
        "transformers",
        help="the thinker's engine: transformers (text, audio, images, video) or vllm "
        "(vLLM's async engine: continuous batching, prefix caching; text prompts only, its Info says "
        "so; run with the vLLM environment's python, see `make setup-vllm`)",
    )
    vllm_load: Literal["auto", "text", "native"] = setting(
        "auto",
        help="with --backend vllm: text (the thinker's language model converted to a "
        "Qwen3MoeForCausalLM directory beside the checkpoint), native (the checkpoint itself, "
        "through vLLM's Qwen3-Omni thinker), or auto (native on cuda, text on cpu)",
    )


@dataclass(frozen=True)
class LoadOptions(ThinkerLoadSettings, TalkerLoadSettings):
    """Every load setting at once (device, dtype, the talker's frames, the thinker's backend), for a
    tool or test that loads any stage; each declared once above. A stage's engine takes its own
    settings (omnistream/engine/settings.py), which hold the part that is that stage's."""
