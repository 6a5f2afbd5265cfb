"""Aten ops one engine step dispatches: a thinker token, a talker frame, a Code2Wav window.

What `tools/op-counts` prints and `tools/gpu-smoke` reports. Each engine is stepped by hand on this
thread (`_next_work` + `_run`, as its own thread does, and as
tests/unit/models/qwen3_omni/test_host_syncs.py does) until it is in its steady state, then one
more step is counted with `omnistream.engine.op_count.OpCounter`:

- thinker token: a decode step of the whole batch (every prompt prefilled);
- talker frame: the 15 code-predictor steps of every row, its sampling, and the talker forward that
  gives every row its next codebook 0 (the second such frame, so no first-frame work is counted);
  `talker` is the eager frame (`--no-static-frames`), `talker-static` the same frame with static
  frames (omnistream/models/qwen3_omni/talker/frame.py, the default);
- Code2Wav window: every row's second window, decoded from its carried state.

Ops are split into those inside graph-capturable regions (`omnistream.engine.capture`) and those outside
(host work between graph replays). Requests sample with every knob (temperature, top-k, top-p,
repetition penalty), one seed each, unless `greedy`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from omnistream.engine.engine import Engine
from omnistream.engine.load_options import LoadOptions
from omnistream.engine.op_count import OpCounter, OpCounts
from omnistream.engine.settings import (
    Code2WavEngineSettings,
    TalkerEngineSettings,
    ThinkerEngineSettings,
    derive,
)
from omnistream.request.sampling_params import SamplingParams

STAGES = ("thinker", "talker", "talker-static", "code2wav")
# The "real-shaped" build: the real code predictor's depth and the real experts' routing (128
# experts, 8 active a thinker token, 6 a talker row), two thinker and talker layers.
REAL_SHAPED: dict[str, Any] = {"layers": 2, "code_predictor_layers": 5, "experts": 128, "top_k": (8, 6)}


@dataclass(frozen=True)
class StepOps:
    stage: str
    batch: int
    counts: OpCounts

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "batch": self.batch, **self.counts.as_dict()}


def real_shaped_model(directory: str | Path) -> str:
    """The tiny checkpoint with the real model's code-predictor depth and experts' routing (built
    once, then reused)."""
    from omnistream.models.qwen3_omni import tiny

    return str(tiny.built(directory, seed=0, **REAL_SHAPED))


def _sampling(row: int, greedy: bool) -> SamplingParams:
    if greedy:
        return SamplingParams()
    return SamplingParams(temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.1, seed=row)


def _step(engine: Engine[Any, Any], counted: bool = False) -> OpCounts | None:
    """One engine step on this thread; its ops when `counted`."""
    with engine._cond:
        work = engine._next_work()
    if work is None:
        raise RuntimeError(f"{engine.name}: no work to step")
    with torch.inference_mode():
        if not counted:
            engine._run(work)
            return None
        counter = OpCounter()
        with counter:
            engine._run(work)
    return counter.counts


def _prefill(engine: Engine[Any, Any], started: Callable[[Any], bool], limit: int = 1000) -> None:
    for _ in range(limit):
        if all(started(s) for s in engine._requests.values()):
            return
        _step(engine)
    raise RuntimeError(f"{engine.name}: requests did not start")


def thinker_token(model_dir: str, batch: int, options: LoadOptions, greedy: bool = False) -> OpCounts:
    from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
    from omnistream.request.stage_chain import ThinkerParams

    engine = ThinkerEngine(
        model_dir, derive(ThinkerEngineSettings, options, max_batch=batch, max_model_len=256)
    )

    async def run() -> OpCounts:
        prompt = engine.encode_chat([{"role": "user", "content": "hello there"}])
        for row in range(batch):
            params = ThinkerParams(max_tokens=64, ignore_eos=True, sampling=_sampling(row, greedy))
            engine.add_request(f"r{row}", prompt, params)
        _prefill(engine, lambda s: s.next_token is not None)
        _step(engine)
        counts = _step(engine, counted=True)
        assert counts is not None
        return counts

    return asyncio.run(run())


def talker_frame(model_dir: str, batch: int, options: LoadOptions, greedy: bool = False) -> OpCounts:
    from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
    from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
    from omnistream.request.stage_chain import TalkerParams

    engine = TalkerEngine(
        model_dir, derive(TalkerEngineSettings, options, max_batch=batch, max_model_len=256)
    )
    chat = ThinkerEngine(model_dir, derive(ThinkerEngineSettings, options, max_batch=1, max_model_len=256))

    async def run() -> OpCounts:
        prompt = chat.encode_chat([{"role": "user", "content": "hello"}])
        for row in range(batch):
            params = TalkerParams(max_frames=64, sampling=_sampling(row, greedy), ignore_eos=True)
            engine.add_request(f"r{row}", params)
            engine.feed(f"r{row}", list(range(5, 45)), last=False, prompt_ids=prompt)
        _prefill(engine, lambda s: s.pending_code0 is not None)
        _step(engine)  # the first frame of every row
        states = list(engine._requests.values())
        if len(states) != batch or not all(s.pending_code0 is not None for s in states):
            raise RuntimeError("talker: a row ended before its second frame (codec end sampled)")
        counts = _step(engine, counted=True)
        assert counts is not None
        return counts

    return asyncio.run(run())


def code2wav_window(model_dir: str, batch: int, options: LoadOptions, greedy: bool = False) -> OpCounts:
    from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
    from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan

    engine = Code2WavEngine(model_dir, derive(Code2WavEngineSettings, options, max_batch=batch))
    gen = torch.Generator().manual_seed(0)

    async def run() -> OpCounts:
        for row in range(batch):
            engine.add_request(f"r{row}", ChunkPlan(4, 8, 8))
            codes = torch.randint(0, engine.codebook_size, (engine.num_quantizers, 40), generator=gen)
            engine.feed(f"r{row}", codes, last=False)
        _step(engine)  # first windows: fresh states
        counts = _step(engine, counted=True)  # a later window of every row, from carried state
        assert counts is not None
        return counts

    return asyncio.run(run())


def static_talker_frame(model_dir: str, batch: int, options: LoadOptions, greedy: bool = False) -> OpCounts:
    """`talker_frame` with static frames (omnistream/models/qwen3_omni/talker/frame.py)."""
    return talker_frame(model_dir, batch, dataclasses.replace(options, static_frames=True), greedy)


def eager_talker_frame(model_dir: str, batch: int, options: LoadOptions, greedy: bool = False) -> OpCounts:
    """`talker_frame` without static frames: the eager frame, dynamic shapes."""
    return talker_frame(model_dir, batch, dataclasses.replace(options, static_frames=False), greedy)


MEASURES = {
    "thinker": thinker_token,
    "talker": eager_talker_frame,
    "talker-static": static_talker_frame,
    "code2wav": code2wav_window,
}


def measure(
    model_dir: str,
    options: LoadOptions,
    stages: tuple[str, ...] = STAGES,
    batches: tuple[int, ...] = (1, 8),
    greedy: bool = False,
) -> list[StepOps]:
    """Ops of one steady step per (stage, batch), in that order."""
    return [
        StepOps(stage, batch, MEASURES[stage](model_dir, batch, options, greedy))
        for stage in stages
        for batch in batches
    ]
