"""The parts of `tools/gpu-check --all`, per checkpoint: step times, parity, and RTF/TTFP through
`omnistream up`; with the sizes each runs at and the time budget they share.

Each part is a function of the checkpoint that returns a JSON-ready dict; a measurement inside it
that fails (a batch that does not fit, a cell cut at the budget) is recorded in its place and the
part goes on, so one bad cell never costs the rest of the table.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omnistream.bench.gpu_check.parity import ParitySizes
from omnistream.bench.gpu_check.served import ServedSizes


@dataclass(frozen=True)
class Sizes:
    """How much each part does. FULL is sized for both checkpoints in 8 minutes of one GPU from the
    first GPU run's step times (not yet timed on a device: --budget-s guards it; docs/gpu.md);
    SMALL (`--small`) runs the same path on 2 CPU cores in under a minute, for the test suite."""

    steps: int = 10  # timed engine steps per (stage, batch), after `warmup` untimed ones
    warmup: int = 3
    parity: ParitySizes = field(
        default_factory=lambda: ParitySizes(prompts=3, max_tokens=24, max_frames=40, concurrency=4)
    )
    served: ServedSizes = field(default_factory=ServedSizes)


FULL = Sizes()
SMALL = Sizes(
    steps=3,
    warmup=1,
    # One prompt: the path is what the CPU test keeps working (tests/reference compares every build).
    # The second, on the real-shaped build, differs from transformers today (docs/gpu.md).
    parity=ParitySizes(prompts=1, max_tokens=8, max_frames=12, concurrency=2),
    served=ServedSizes(input_len=16, output_len=8, audio_frames=16, min_requests=2, warmup=1),
)


@dataclass
class Budget:
    """The run's time budget: parts (and cells inside them) that would start once it is spent are
    skipped, so the run ends near `total_s` instead of being killed with its table unwritten."""

    total_s: float
    started: float = field(default_factory=time.monotonic)

    @property
    def deadline(self) -> float:
        return self.started + self.total_s

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def spent(self) -> bool:
        return self.left() <= 0

    def elapsed(self) -> float:
        return time.monotonic() - self.started


@dataclass(frozen=True)
class Settings:
    """What `--all` runs: the checkpoints (label, directory), where and in what precision the speed
    parts run (parity is always float32), the batch sizes and concurrencies, sizes and budget."""

    checkpoints: tuple[tuple[str, str], ...]
    device: str = "cuda"
    dtype: str = "bfloat16"
    batches: tuple[int, ...] = (1, 16, 64)
    concurrencies: tuple[int, ...] = (1, 16, 64)
    sizes: Sizes = field(default_factory=Sizes)
    out: Path = Path("out/gpu-check")
    budget_s: float = 480.0

    def described(self) -> dict[str, Any]:
        """JSON-ready, for the report's header."""
        return {
            "checkpoints": dict(self.checkpoints),
            "device": self.device,
            "dtype": self.dtype,
            "batches": list(self.batches),
            "concurrencies": list(self.concurrencies),
            "sizes": dataclasses.asdict(self.sizes),
            "budget_s": self.budget_s,
        }


def _error(exc: BaseException) -> dict[str, str]:
    return {"error": f"{type(exc).__name__}: {exc}"[:500], "trace": traceback.format_exc()[-3000:]}


def step_times(model: str, settings: Settings, budget: Budget) -> dict[str, Any]:
    """ms per thinker token, talker frame and Code2Wav chunk at each batch size, in `settings.dtype`
    with the load defaults (the talker's CUDA graphs on for CUDA); each (stage, batch) its own cell."""
    from omnistream.bench.gpu_check.steps import MEASURES, StepSettings, step_ms
    from omnistream.engine.load_options import LoadOptions

    step = StepSettings(model, settings.device, settings.dtype, settings.sizes.steps, settings.sizes.warmup)
    report: dict[str, Any] = {
        "dtype": settings.dtype,
        "cuda_graphs": LoadOptions(settings.device).graphs,
        "sampling": "sampled",
        "steps": step.steps,
    }
    for stage, key in MEASURES.items():
        cells: dict[str, Any] = {}
        for batch in settings.batches:
            if budget.spent():
                cells[str(batch)] = {"skipped": "the time budget was spent"}
                continue
            try:
                cells[str(batch)] = step_ms(stage, batch, step)
            except Exception as exc:  # e.g. out of memory at 64: that cell's finding, the rest go on
                cells[str(batch)] = _error(exc)
        report[key] = cells
    return report


# The kernels the experts part compares: transformers' sparse one and the project's fixed shapes.
EXPERTS = ("grouped_mm", "fixed")


def experts(model: str, settings: Settings, budget: Budget) -> dict[str, Any]:
    """The thinker's and the talker's step with each MoE experts kernel, at the batches up to 16: on
    the H200 a bfloat16 thinker token took 88 ms at batch 16 against 6.7 at batch 1 (docs/gpu.md);
    the CPU rules out host work and arithmetic, so this says whether the device's grouped_mm is it."""
    import dataclasses as dc

    from omnistream.bench.gpu_check.steps import MEASURES, StepSettings, profiled, step_ms

    step = StepSettings(model, settings.device, settings.dtype, settings.sizes.steps, settings.sizes.warmup)
    batches = [b for b in settings.batches if b <= 16]
    report: dict[str, Any] = {"dtype": settings.dtype}
    for stage in ("thinker", "talker"):
        for kernel in EXPERTS:
            cells: dict[str, Any] = {}
            for batch in batches:
                if budget.spent():
                    cells[str(batch)] = {"skipped": "the time budget was spent"}
                    continue
                try:
                    cells[str(batch)] = step_ms(stage, batch, dc.replace(step, experts=kernel))
                except Exception as exc:
                    cells[str(batch)] = _error(exc)
            report[f"{MEASURES[stage]}_{kernel}"] = cells
    if batches and not budget.spent():  # where the time of the default kernel's largest batch goes
        try:
            step_ms("thinker", batches[-1], dc.replace(step, profile=True))
            report["thinker_profile"] = profiled()
        except Exception as exc:
            report["thinker_profile"] = _error(exc)
    return report


def parity(model: str, settings: Settings, budget: Budget) -> dict[str, Any]:
    """The pipeline against transformers' `generate`, float32, on the device (parity.check)."""
    from omnistream.bench.gpu_check.parity import check

    return check(model, settings.device, settings.sizes.parity)


def served(model: str, settings: Settings, budget: Budget) -> dict[str, Any]:
    """RTF and TTFP at each concurrency through `omnistream up` in `settings.dtype` (served.served)."""
    from omnistream.bench.gpu_check.served import served as run_served

    log = settings.out / f"up-{Path(model).name}.log"
    return run_served(
        model,
        settings.device,
        settings.dtype,
        list(settings.concurrencies),
        settings.sizes.served,
        log,
        budget.deadline,
    )


Part = Callable[[str, Settings, Budget], dict[str, Any]]
# In run order: every checkpoint's step times first (the GPU work's main question), the experts
# kernels' (the bfloat16 slowdown's suspect), then parity,
# then the served stacks (the longest: a stack start each); a cut run keeps the first ones.
PARTS: tuple[tuple[str, Part], ...] = (
    ("steps", step_times),
    ("experts", experts),
    ("parity", parity),
    ("served", served),
)


def prepare(label: str, directory: str) -> str:
    """The checkpoint's directory, built first where it is one this project builds: the real-shaped
    one by op_counts.real_shaped_model (its shape is that function's), the default tiny one."""
    if label == "real-shaped":
        from omnistream.bench.op_counts import real_shaped_model

        return real_shaped_model(directory)
    from omnistream.cli.common import ensure_default_model

    ensure_default_model(directory)
    return directory
