"""A short smoke run of each stage on a device: load it there, run one request, and measure each
engine step (wall time and host syncs). What `tools/gpu-smoke` runs; it works on the CPU too, so the
test suite keeps it from rotting while no GPU is around.

Steps are taken by hand on this thread (`plan_step` + `run_step`, as the engine thread does), so each
step's host syncs can be counted alone. A host sync is a call that hands a tensor's value to Python
(`.item()`, `.tolist()`, `int(t)`, ...): on a GPU each one waits for the device. The counter of
tests/unit/models/qwen3_omni/test_host_syncs.py is used where that file exists; otherwise this
module's own, which counts the same methods.

It also counts the aten ops of one steady step per stage at batch 1 and `max_batch`, inside and
outside graph-capturable regions (`omnistream/bench/op_counts.py`, what `tools/op-counts` prints):
on a GPU each op outside a captured graph is one launch paid by the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch

from omnistream.engine.load_options import LoadOptions, is_accelerator
from omnistream.engine.settings import STAGE_SETTINGS, EngineSettings, derive

if TYPE_CHECKING:
    from omnistream.engine.api import Code2WavStageEngine, StageEngine, TalkerStageEngine
    from omnistream.engine.engine import Engine
    from omnistream.engine.output_stream import OutputStream

SYNC_METHODS = ("item", "tolist", "__int__", "__bool__", "__float__", "__index__", "cpu", "numpy")
STAGE_ORDER = ("thinker", "talker", "code2wav")


def record(results: dict[str, Any], name: str, body: Callable[[], dict[str, Any] | None]) -> None:
    """Run one check; a failure is a finding: record its error and trace, print a line, go on."""
    started = time.perf_counter()
    try:
        results[name] = {"ok": True, **(body() or {})}
    except Exception as exc:
        results[name] = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "trace": traceback.format_exc(),
        }
    results[name]["seconds"] = round(time.perf_counter() - started, 2)
    status = "ok" if results[name]["ok"] else "FAILED: " + results[name]["error"]
    print(f"[{name}] {status} ({results[name]['seconds']} s)", flush=True)


class SyncCounting(Protocol):
    """A host-sync counter: `counting()` counts the sync calls made inside it, by method name."""

    def counting(self) -> contextlib.AbstractContextManager[Mapping[str, int]]: ...


class _OwnSyncCounter:
    """Counts calls of SYNC_METHODS on any tensor while `counting()` is active."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        self.counts.clear()
        saved = [(name, getattr(torch.Tensor, name)) for name in SYNC_METHODS]

        def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def counted(*args: Any, **kwargs: Any) -> Any:
                self.counts[name] += 1
                return fn(*args, **kwargs)

            return counted

        for name, fn in saved:
            setattr(torch.Tensor, name, wrap(name, fn))
        try:
            yield self.counts
        finally:
            for name, fn in saved:
                setattr(torch.Tensor, name, fn)


def sync_counter() -> Any:
    """tests/unit/models/qwen3_omni/test_host_syncs.py's counter when it is there (one definition of a
    sync), else ours."""
    try:
        # Found in a checkout (mypy reads it there), absent from an installed package.
        from tests.unit.models.qwen3_omni.test_host_syncs import SyncCounter  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return _OwnSyncCounter()
    return SyncCounter()


def _synchronize(device: str) -> None:
    if is_accelerator(device) and torch.cuda.is_available():
        torch.cuda.synchronize(torch.device(device))


def step_until_done(engine: Engine[Any, Any], device: str, counter: SyncCounting) -> list[dict[str, Any]]:
    """Step the (not started) engine on this thread until it has no work; per step: ms and syncs."""
    steps: list[dict[str, Any]] = []
    while True:
        work = engine.plan_step()  # what ended is released first, as on the engine thread
        if work is None:
            return steps
        _synchronize(device)
        started = time.perf_counter()
        with torch.inference_mode(), counter.counting() as counts:
            engine.run_step(work)
            syncs = sum(counts.values())
            by_name = dict(counts)
        _synchronize(device)
        steps.append({"ms": 1000 * (time.perf_counter() - started), "syncs": syncs, "calls": by_name})


async def _submit(
    stage: str, engine: StageEngine, max_tokens: int, max_frames: int, prompt: list[int]
) -> OutputStream[Any]:
    """One request into `stage`'s engine (each stage takes its own inputs); its output stream."""
    from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan
    from omnistream.request.stage_chain import TalkerParams, ThinkerParams

    if stage == "thinker":
        return engine.add_request("smoke", prompt, ThinkerParams(max_tokens=max_tokens, ignore_eos=True))
    if stage == "talker":
        talker = cast("TalkerStageEngine", engine)
        out = talker.add_request("smoke", TalkerParams(max_frames=max_frames, ignore_eos=True))
        talker.feed("smoke", list(range(5, 5 + max_frames + 4)), True, prompt_ids=prompt)
        return out
    code2wav = cast("Code2WavStageEngine", engine)
    out = code2wav.add_request("smoke", ChunkPlan(4, 8, 8))
    codes = torch.randint(
        0,
        code2wav.codebook_size,
        (code2wav.num_quantizers, max_frames),
        generator=torch.Generator().manual_seed(0),
    )
    code2wav.feed("smoke", codes, True)
    return out


def _summary(steps: list[dict[str, Any]]) -> dict[str, Any]:
    ms = [s["ms"] for s in steps]
    syncs = [s["syncs"] for s in steps]
    calls: Counter[str] = Counter()
    for s in steps:
        calls.update(s["calls"])
    return {
        "steps": len(steps),
        "first_step_ms": round(ms[0], 2) if ms else None,
        "median_step_ms": round(statistics.median(ms), 2) if ms else None,
        "max_step_ms": round(max(ms), 2) if ms else None,
        "syncs_per_step": {
            "median": statistics.median(syncs) if syncs else None,
            "max": max(syncs, default=None),
        },
        "sync_calls": dict(calls),
    }


def smoke(
    model: str,
    options: LoadOptions,
    devices: dict[str, str] | None = None,
    stages: tuple[str, ...] = STAGE_ORDER,
    max_tokens: int = 8,
    max_frames: int = 16,
    max_batch: int = 4,
    max_model_len: int = 512,
    op_counts: bool = True,
) -> dict[str, Any]:
    """Load each stage on its device, one request through it, step stats; a dict for JSON. With
    `op_counts`, also the ops of one steady step per stage (`results["op_counts"]`)."""
    from omnistream.models.family import family_for
    from omnistream.models.qwen3_omni.memory import stage_memory

    family = family_for(model)
    devices = devices or {}
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "model": model,
    }
    prompt: list[int] = []
    counter = sync_counter()
    results["sync_counter"] = type(counter).__module__ + "." + type(counter).__name__

    for stage in stages:
        stage_options = derive(
            STAGE_SETTINGS[stage], options, max_batch=max_batch, max_model_len=max_model_len
        ).on(devices.get(stage))

        def run(stage: str = stage, stage_options: EngineSettings = stage_options) -> dict[str, Any]:
            nonlocal prompt
            device = stage_options.device
            on_cuda = is_accelerator(device) and torch.cuda.is_available()
            if on_cuda:
                torch.cuda.reset_peak_memory_stats(torch.device(device))
            started = time.perf_counter()
            engine = family.engine(stage, model, stage_options)
            _synchronize(device)
            load_s = time.perf_counter() - started
            if not prompt and hasattr(engine, "encode_chat"):
                prompt = engine.encode_chat([{"role": "user", "content": "Say something short."}])
            if not prompt:  # the talker alone: a chat prompt from the family's tokenizer
                tokenizer = family.load_tokenizer(model)
                ids = tokenizer.apply_chat_template(
                    [{"role": "user", "content": "Say something short."}], add_generation_prompt=True
                )
                prompt = list(ids if isinstance(ids, list) else ids["input_ids"])

            async def one_request() -> tuple[list[dict[str, Any]], int]:
                out = await _submit(stage, engine, max_tokens, max_frames, prompt)
                steps = step_until_done(cast("Engine[Any, Any]", engine), device, counter)
                items = 0  # all there already: a request that did not finish times out here
                while await asyncio.wait_for(out.get(), 5) is not None:
                    items += 1
                return steps, items

            steps, items = asyncio.run(one_request())
            report = {
                "device": device,
                "dtype": stage_options.dtype_name,
                "load_s": round(load_s, 2),
                "outputs": items,
                **_summary(steps),
            }
            estimate = stage_memory(engine.config, stage, stage_options.dtype_name, max_batch, max_model_len)
            report["estimated_gib"] = round(estimate.total / 2**30, 3)
            if on_cuda:
                report["peak_allocated_gib"] = round(
                    torch.cuda.max_memory_allocated(torch.device(device)) / 2**30, 3
                )
            return report

        record(results, stage, run)
    if op_counts:
        record(results, "op_counts", lambda: _op_counts(model, options, devices, stages, max_batch))
    return results


def _op_counts(
    model: str, options: LoadOptions, devices: dict[str, str], stages: tuple[str, ...], max_batch: int
) -> dict[str, Any]:
    """Aten ops of one steady step per stage (sampled requests), at batch 1 and `max_batch`; the
    talker's frame also with static frames (`talker-static`, captured with --cuda-graphs)."""
    from omnistream.bench.op_counts import measure

    batches = tuple(sorted({1, max_batch}))
    return {
        "per_step": [
            result.as_dict()
            for stage in stages
            for kind in ((stage, "talker-static") if stage == "talker" else (stage,))
            for result in measure(model, options.on(devices.get(stage)), (kind,), batches)
        ]
    }
