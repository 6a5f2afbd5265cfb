"""Engine step times for `tools/gpu-check --all`: ms per thinker decode token, talker frame and
Code2Wav chunk (a 25-frame window) at one batch size, through tools/step-times' own stepping.

tools/step-times steps each engine by hand on this thread (`_next_work` + `_run`, as the engine
thread does), so its numbers are compute and host overhead only. Its per-stage functions are loaded
from the script itself, not copied here: one definition of "a step" for both tools, and step-times
keeps working unchanged against older checkouts (its reason to use only long-lived engine APIs).
"""

from __future__ import annotations

import argparse
import gc
import importlib.machinery
import importlib.util
import statistics
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

import torch

STEP_TIMES = Path(__file__).resolve().parents[3] / "tools" / "step-times"
# The stages step-times times, and what one of their steps is, as the table names them.
MEASURES = {
    "thinker": "thinker_ms_per_token",
    "talker": "talker_ms_per_frame",
    "code2wav": "code2wav_ms_per_chunk",
}


@dataclass(frozen=True)
class StepSettings:
    """What one measurement runs: the checkpoint and load settings, and how many steps are timed
    (after `warmup` untimed ones, which also capture the talker's CUDA graphs for the batch).
    `cuda_graphs` None: the default, on for CUDA. Requests sample with every knob unless `greedy`
    (a deployment's requests sample)."""

    model: str
    device: str = "cuda"
    dtype: str = "bfloat16"
    steps: int = 10
    warmup: int = 3
    cuda_graphs: bool | None = None
    greedy: bool = False
    experts: str | None = None  # the MoE experts kernel (None: the load default, `--experts auto`)
    profile: bool = False  # also profile one more step (step-times --profile): `profiled` returns it


@cache
def step_times_module() -> ModuleType:
    """tools/step-times as a module (it has no .py suffix, so it is loaded by path)."""
    loader = importlib.machinery.SourceFileLoader("omnistream_step_times", str(STEP_TIMES))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    if spec is None:
        raise ImportError(f"cannot load {STEP_TIMES}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _arguments(settings: StepSettings) -> argparse.Namespace:
    """step-times' arguments for `settings`, parsed by its own parser: every flag it has (and any it
    gains) takes its own default, so what its stage functions read is always there."""
    argv = ["step-times", "--model", settings.model, "--device", settings.device, "--dtype", settings.dtype]
    argv += ["--steps", str(settings.steps), "--warmup", str(settings.warmup)]
    if settings.cuda_graphs is not None:
        argv.append("--cuda-graphs" if settings.cuda_graphs else "--no-cuda-graphs")
    if settings.greedy:
        argv.append("--greedy")
    if settings.experts is not None:
        argv += ["--experts", settings.experts]
    if settings.profile:
        argv += ["--profile", "-"]  # the table is read from the module (`profiled`), not the file
    saved, sys.argv = sys.argv, argv
    try:
        args: argparse.Namespace = step_times_module()._parse()
    finally:
        sys.argv = saved
    return args


def step_ms(stage: str, batch: int, settings: StepSettings) -> float:
    """Median ms of one step of `stage` with `batch` requests stepping together (each step is one
    token, frame or chunk for every one of them). The engine is dropped and the device's cache
    emptied after it, so the next measurement (or the `omnistream up` after them) has the memory."""
    module = step_times_module()
    try:
        times: list[float] = module.STAGES[stage](_arguments(settings), batch)
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return round(1000 * statistics.median(times), 3)


def profiled() -> str:
    """The torch.profiler table of the last step measured with `profile` (self device time by op on
    CUDA, self CPU time elsewhere), or "" when none was."""
    tables: list[str] = step_times_module().PROFILES
    return tables[-1] if tables else ""
