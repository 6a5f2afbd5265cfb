"""Warm-up requests for the Qwen3-Omni engines: the smallest input each stage accepts; and the speed
probe of the audio stages.

A stage reports SERVING only after one of these ran, so lazy allocations (KV slots, kernels, the
Code2Wav's first streaming step) happen before the first client, not inside its time to first audio.
The talker's input must look like a real chat (it looks for the assistant turn), hence the ChatML
ids from the config rather than arbitrary tokens.

The probe runs batches of a few sizes up to `max_batch` (ignore_eos, greedy), so the stage's
step-time model (omnistream/service/step_model.py) knows its larger batches before any client made
one: the gateway admits audio streams by it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Any, cast

import torch

from omnistream.engine.api import Code2WavStageEngine, StageEngine, TalkerStageEngine
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan
from omnistream.request.stage_chain import TalkerParams, ThinkerParams


def talker_warmup_prompt(config: Any) -> list[int]:
    """`<|im_start|>user X<|im_end|> X<|im_start|>assistant X`: the shortest prompt with a user turn
    and an assistant turn, built from the checkpoint's own special-token ids."""
    return [
        config.im_start_token_id,
        config.user_token_id,
        0,
        config.im_end_token_id,
        0,
        config.im_start_token_id,
        config.assistant_token_id,
        0,
    ]


async def _drain(out: AsyncIterable[Any]) -> None:
    async for _ in out:
        pass


async def warm_thinker(engine: StageEngine) -> None:
    await _drain(engine.add_request("warmup", [0, 1, 2], ThinkerParams(max_tokens=2, ignore_eos=True)))


async def warm_talker(stage_engine: StageEngine) -> None:
    engine = cast(TalkerStageEngine, stage_engine)
    out = engine.add_request("warmup", TalkerParams(max_frames=2))
    engine.feed("warmup", [0], True, prompt_ids=talker_warmup_prompt(engine.config))
    await _drain(out)


async def warm_code2wav(stage_engine: StageEngine) -> None:
    engine = cast(Code2WavStageEngine, stage_engine)
    out = engine.add_request("warmup", ChunkPlan(2, 25, 25))
    engine.feed("warmup", torch.zeros((engine.num_quantizers, 3), dtype=torch.long), True)
    await _drain(out)


# Each stage's warm-up: what the family's `warm_up(stage, engine)` runs.
WARMERS: dict[str, Callable[[StageEngine], Awaitable[None]]] = {
    "thinker": warm_thinker,
    "talker": warm_talker,
    "code2wav": warm_code2wav,
}

PROBE_TALKER_FRAMES = 6  # frames per request of a probe batch (its steps are the measure)
PROBE_CODE2WAV_WINDOWS = 2  # windows per request: the second decodes with its left context, as serving does
MAX_PROBE_CODE2WAV_BATCH = 8  # a Code2Wav step grows with its frames: larger batches teach no new shape


def probe_sizes(max_batch: int) -> list[int]:
    """1, a quarter and all of `max_batch` (distinct, ascending)."""
    return sorted({1, max(1, max_batch // 4), max(1, max_batch)})


async def probe_talker(stage_engine: StageEngine) -> None:
    engine = cast(TalkerStageEngine, stage_engine)
    prompt = talker_warmup_prompt(engine.config)
    for size in probe_sizes(engine.max_step_batch):
        outs = []
        for i in range(size):
            rid = f"speed-probe-{size}-{i}"
            outs.append(
                engine.add_request(rid, TalkerParams(max_frames=PROBE_TALKER_FRAMES, ignore_eos=True))
            )
            engine.feed(rid, [0] * PROBE_TALKER_FRAMES, True, prompt_ids=prompt)
        await asyncio.gather(*(_drain(out) for out in outs))


async def probe_code2wav(stage_engine: StageEngine) -> None:
    engine = cast(Code2WavStageEngine, stage_engine)
    plan = ChunkPlan(25, 25, 25)
    frames = torch.zeros((engine.num_quantizers, plan.chunk * PROBE_CODE2WAV_WINDOWS), dtype=torch.long)
    for size in probe_sizes(min(engine.max_batch, MAX_PROBE_CODE2WAV_BATCH)):
        outs = []
        for i in range(size):
            rid = f"speed-probe-{size}-{i}"
            outs.append(engine.add_request(rid, plan))
            engine.feed(rid, frames, True)
        await asyncio.gather(*(_drain(out) for out in outs))


# The audio stages' speed probes (the thinker's speed is reported but admits nothing).
PROBES: dict[str, Callable[[StageEngine], Awaitable[None]]] = {
    "talker": probe_talker,
    "code2wav": probe_code2wav,
}
