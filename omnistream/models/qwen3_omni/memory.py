"""Device memory per stage, computed from a config alone, and the start-time check that uses it.

A stage needs its weights, its KV cache (allocated whole at start: `SlotKVCache` holds
`max_batch` slots of `max_model_len` positions) and some headroom (activations, the CUDA context,
allocator slack). All three follow from the config and the serving flags, so the numbers are known
before a byte is loaded: the stage refuses to start, naming what it needs, what is free and which
flags reduce it, instead of dying with an out-of-memory error halfway through loading 60 GiB.

Weights are counted exactly by building the stage's holder module on the `meta` device (no memory,
no checkpoint). docs/gpu.md's memory table is this module's output for the real
Qwen3-Omni-30B-A3B-Instruct config (data/qwen3-omni-30b-a3b-instruct.config.json):
`python -m omnistream.models.qwen3_omni.memory` prints it; tests/unit/models/qwen3_omni/test_memory.py keeps
the two equal.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnistream.engine.load_options import DTYPE_BYTES, DeviceSettings, is_accelerator
from omnistream.engine.settings import EngineSettings
from omnistream.request.errors import InvalidRequest

GIB = 1 << 30
HEADROOM_FRACTION = 0.10  # of weights + KV cache: activations grow with the batch and the model
HEADROOM_FIXED = 1 * GIB  # CUDA context, cuBLAS workspaces, allocator slack
REAL_CONFIG = Path(__file__).parent / "data" / "qwen3-omni-30b-a3b-instruct.config.json"
STAGES = ("thinker", "talker", "code2wav")
# The serving defaults (omnistream/engine/settings.py, declared there) the docs/gpu.md table is computed at.
DEFAULT_MAX_BATCH = EngineSettings.max_batch
DEFAULT_MAX_MODEL_LEN = EngineSettings.max_model_len


@dataclass(frozen=True)
class StageMemory:
    stage: str
    params: int
    weights: int  # bytes
    kv_cache: int  # bytes
    headroom: int  # bytes
    prefix_cache: int = 0  # bytes: the prefix cache's budget (thinker, talker; engine/prefix_cache.py)

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.headroom + self.prefix_cache


def default_prefix_cache_bytes(kv_cache: int) -> int:
    """The prefix cache's default budget: half the KV slots' bytes, i.e. the whole contexts of half
    the batch's conversations kept between their turns, while the thinker still fits an 80 GiB
    card at the defaults (docs/gpu.md)."""
    return kv_cache // 2


def kv_cache_bytes(text_config: Any, slots: int, capacity: int, dtype_bytes: int) -> int:
    """layers x kv heads x head_dim x capacity x slots x 2 (K and V) x dtype bytes."""
    head_dim: int = (
        getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    )
    layers: int = text_config.num_hidden_layers
    heads: int = text_config.num_key_value_heads
    return layers * heads * head_dim * capacity * slots * 2 * dtype_bytes


def code2wav_state_bytes(config: Any, requests: int, dtype_bytes: int) -> int:
    """Code2Wav's state slots: one row of its decoder's streaming state (attention window, conv
    tails, transposed-conv overlaps) per request held, plus the padding rows' scratch slot."""
    import torch

    from omnistream.models.qwen3_omni.checkpoint import STAGE_CLASSES
    from omnistream.models.qwen3_omni.code2wav.forward import StreamForward

    with torch.device("meta"):
        holder = STAGE_CLASSES["code2wav"](config)
        model: Any = holder.code2wav  # the holder's Qwen3OmniMoeCode2Wav
        shapes = StreamForward(model).state_shapes()
    return (requests + 1) * shapes.size * dtype_bytes


def stage_params(config: Any, stage: str) -> int:
    """Parameters the stage loads (its holder module built on the meta device: exact, free)."""
    import torch

    from omnistream.models.qwen3_omni.checkpoint import STAGE_CLASSES

    with torch.device("meta"):
        holder = STAGE_CLASSES[stage](config)
    return sum(p.numel() for p in holder.parameters()) + sum(b.numel() for b in holder.buffers())


def stage_memory(
    config: Any,
    stage: str,
    dtype: str,
    max_batch: int,
    max_model_len: int,
    prefix_cache_bytes: int | None = None,
    requests: int | None = None,
) -> StageMemory:
    """What `stage` needs on its device at these flags (`dtype` a resolved name, e.g. bfloat16).
    `prefix_cache_bytes`: the thinker's or the talker's prefix cache budget (None: its default,
    half its KV slots). `requests`: the requests a stage holds (`EngineSettings.request_limit`; None:
    its default for `max_batch`), each with a Code2Wav state slot."""
    from omnistream.engine.settings import REQUESTS_PER_SLOT
    from omnistream.models.qwen3_omni.constants import TALKER_LENGTH_FACTOR

    size = DTYPE_BYTES[dtype]
    params = stage_params(config, stage)
    if stage == "thinker":
        kv = kv_cache_bytes(config.thinker_config.text_config, max_batch, max_model_len, size)
        predictor = 0
    elif stage == "talker":
        talker = config.talker_config
        kv = kv_cache_bytes(talker.text_config, max_batch, max_model_len * TALKER_LENGTH_FACTOR, size)
        # The code predictor's per-frame cache: the talker row + one position per code group (no
        # prefix of it is ever cached).
        predictor = kv_cache_bytes(talker.code_predictor_config, max_batch, talker.num_code_groups + 1, size)
    elif stage == "code2wav":
        # Every held request's streaming state, kept in device slots (code2wav/slots.py).
        kv = code2wav_state_bytes(config, requests or max_batch * REQUESTS_PER_SLOT, size)
        predictor = 0
    else:
        raise ValueError(f"unknown stage {stage!r}; stages are {STAGES}")
    prefix = 0
    if stage in ("thinker", "talker"):  # the budget's default follows the slots' KV (the engines')
        prefix = default_prefix_cache_bytes(kv) if prefix_cache_bytes is None else prefix_cache_bytes
    kv += predictor
    weights = params * size
    headroom = int((weights + kv) * HEADROOM_FRACTION) + HEADROOM_FIXED
    return StageMemory(stage, params, weights, kv, headroom, prefix)


def gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def check_stage_fits(
    config: Any,
    stage: str,
    options: DeviceSettings,
    max_batch: int,
    max_model_len: int,
    prefix_cache_bytes: int | None = None,
    requests: int | None = None,
) -> StageMemory | None:
    """On a CUDA device: refuse (InvalidRequest naming the numbers and the flags) when the stage
    will not fit the device's free memory. On the CPU nothing is checked (None)."""
    if not is_accelerator(options.device):
        return None
    import torch

    if not torch.cuda.is_available():
        raise InvalidRequest(f"--device {options.device}: this machine has no CUDA device", field="device")
    need = stage_memory(
        config, stage, options.dtype_name, max_batch, max_model_len, prefix_cache_bytes, requests
    )
    free, total = torch.cuda.mem_get_info(torch.device(options.device))
    if need.total > free:
        raise InvalidRequest(
            f"the {stage} needs {gib(need.total)} on {options.device} (weights {gib(need.weights)} in "
            f"{options.dtype_name} + KV cache {gib(need.kv_cache)} for --max-batch {max_batch} x "
            f"--max-model-len {max_model_len} + prefix cache {gib(need.prefix_cache)} + headroom "
            f"{gib(need.headroom)}) but only {gib(free)} of {gib(total)} is free; lower --max-batch, "
            f"--max-model-len or --prefix-cache-gib, or give the {stage} a GPU of its own (--{stage}-device)",
            field="device",
        )
    return need


def check_placement_fits(
    config: Any, placement: Sequence[tuple[str, DeviceSettings]], max_batch: int, max_model_len: int
) -> dict[str, int]:
    """Stages that start together (`omnistream up` starts them in parallel) each see the whole free
    memory of a shared GPU; the sum must fit. `placement`: (stage, options) per process, replicas
    included. Returns the bytes needed per accelerator device; InvalidRequest when one is short."""
    needs: dict[str, list[StageMemory]] = {}
    for stage, options in placement:
        if is_accelerator(options.device):
            needs.setdefault(options.device, []).append(
                stage_memory(config, stage, options.dtype_name, max_batch, max_model_len)
            )
    if not needs:
        return {}
    import torch

    if not torch.cuda.is_available():
        raise InvalidRequest(f"--device {next(iter(needs))}: this machine has no CUDA device", field="device")
    totals = {}
    for device, stages in needs.items():
        total = sum(m.total for m in stages)
        free, size = torch.cuda.mem_get_info(torch.device(device))
        if total > free:
            parts = " + ".join(f"{m.stage} {gib(m.total)}" for m in stages)
            raise InvalidRequest(
                f"{device} would hold {parts} = {gib(total)} but only {gib(free)} of {gib(size)} is free; "
                "put stages on other GPUs (--thinker-device, --talker-device, --code2wav-device), run "
                "fewer replicas, or lower --max-batch / --max-model-len",
                field="device",
            )
        totals[device] = total
    return totals


def load_real_config() -> Any:
    """The real Qwen3-Omni-30B-A3B-Instruct config (structure only), without the checkpoint."""
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeConfig

    values = json.loads(REAL_CONFIG.read_text())
    values.pop("_comment", None)
    return Qwen3OmniMoeConfig(**values)


def memory_table(
    config: Any,
    dtype: str = "bfloat16",
    max_batch: int = DEFAULT_MAX_BATCH,
    max_model_len: int = DEFAULT_MAX_MODEL_LEN,
) -> str:
    """docs/gpu.md's markdown table: one row per stage."""
    rows = [
        f"| stage | parameters | weights ({dtype}) | KV cache | prefix cache | headroom | needs |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for stage in STAGES:
        m = stage_memory(config, stage, dtype, max_batch, max_model_len)
        rows.append(
            f"| {stage} | {m.params / 1e9:.2f} B | {gib(m.weights)} | {gib(m.kv_cache)} | "
            f"{gib(m.prefix_cache)} | {gib(m.headroom)} | {gib(m.total)} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m omnistream.models.qwen3_omni.memory", description="device memory per stage"
    )
    p.add_argument("--model", default=None, help="checkpoint directory (default: the real 30B config)")
    p.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPE_BYTES))
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH)
    p.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN)
    args = p.parse_args(argv)
    if args.model:
        from omnistream.models.qwen3_omni.checkpoint import load_config

        config = load_config(args.model)
    else:
        config = load_real_config()
    print(memory_table(config, args.dtype, args.max_batch, args.max_model_len))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
