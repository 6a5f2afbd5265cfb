"""Starting vLLM for the thinker: which model it loads, the engine arguments our stage contract
implies (token ids in and out, our sampling as the whole truth, the prefill chunk as its step
budget), the step reports our metrics read, and where the vLLM environment's python is.

Split from vllm_engine.py (the engine API over it); vLLM is imported only inside the functions,
so this module imports without it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omnistream.engine.load_options import DeviceSettings, is_accelerator

LOAD_CHOICES = ("auto", "text", "native")
# vLLM's CPU KV cache in GiB unless the environment says otherwise (its default, 4 GiB per process,
# is far more than a test thinker needs on a shared machine).
CPU_KVCACHE_GIB = "1"


def resolve_load(load: str, device: str) -> str:
    if load not in LOAD_CHOICES:
        raise ValueError(f"unknown vllm load {load!r}; choose from {LOAD_CHOICES}")
    if load == "auto":
        return "native" if is_accelerator(device) else "text"
    return load


def start_async_llm(
    model: str,
    options: DeviceSettings,
    max_model_len: int,
    max_batch: int,
    prefill_chunk: int,
    *,
    native: bool,
    on_step: Callable[[Any, Any], None],
) -> Any:
    """vLLM's AsyncLLM over `model` (a converted text directory, or with `native` the checkpoint
    itself), `on_step(scheduler_stats, iteration_stats)` called for every engine step it reports."""
    from vllm.config import StructuredOutputsConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    device = options.device
    if is_accelerator(device):
        index = device.partition(":")[2]
        if index and "CUDA_VISIBLE_DEVICES" not in os.environ:
            os.environ["CUDA_VISIBLE_DEVICES"] = index  # vLLM takes the first visible device
    else:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    args = AsyncEngineArgs(
        model=model,
        dtype=options.dtype_name,
        max_model_len=max_model_len,
        max_num_seqs=max_batch,
        # vLLM's per-step token budget is our prefill chunk (its chunked prefill is on).
        max_num_batched_tokens=max(prefill_chunk, max_batch),
        enable_prefix_caching=True,
        # Token ids in, token ids out (requests ask for no detokenizing): our tokenizer and chat
        # encoding are the contract's. vLLM still loads the tokenizer: its structured outputs build
        # their token masks from it (the directory's tokenizer files, the thinker's own).
        skip_tokenizer_init=False,
        # Grammar-constrained decoding (tool calls, response_format) with xgrammar, which runs on
        # the CPU as on GPUs; compact JSON, as the transformers thinker compiles it (grammar.py).
        structured_outputs_config=StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True),
        # Our sampling params are the request's whole truth (no generation_config defaults).
        generation_config="vllm",
        enforce_eager=not is_accelerator(device),
        seed=0,
        disable_log_stats=False,
        enable_log_requests=False,
        # The native model is multimodal; this replica takes text only, so vLLM sets up no
        # encoder for it (text-only mode of a multimodal model).
        **({"limit_mm_per_prompt": {"image": 0, "video": 0, "audio": 0}} if native else {}),
    )
    return AsyncLLM.from_engine_args(args, stat_loggers=[_step_recorder(on_step)])


def _step_recorder(on_step: Callable[[Any, Any], None]) -> type[Any]:
    """vLLM's stat logger class that hands every step's stats to `on_step`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepRecorder(StatLoggerBase):  # type: ignore[misc]  # vllm is untyped here (or absent)
        """Each engine step vLLM reports, to the engine's `_on_vllm_step` (our step listeners:
        speed meter, stage metrics; vLLM's running/waiting counts)."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            on_step(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return StepRecorder


def vllm_python_default(root: str | Path | None = None) -> Path:
    """The interpreter of the vLLM environment `make setup-vllm` builds (.venv-vllm at the root)."""
    root = Path(root) if root is not None else Path(__file__).resolve().parents[4]
    return root / ".venv-vllm" / "bin" / "python"
