"""Per-stage step times of the engines, in-process: thinker ms/token, talker ms/frame, Code2Wav
ms/chunk, at a given batch size (every request steps together, so one step = one token/frame/chunk
for each of them). Code2Wav is timed twice, with the same weights and windows: the exact streaming
decode (the default) and the previous recompute decode (left context + lookahead per window)."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from typing import Any, cast

import torch

from omnistream.engine.engine import Engine
from omnistream.engine.load_options import DeviceSettings, LoadOptions
from omnistream.engine.settings import STAGE_SETTINGS, derive
from omnistream.models.family import STAGES, family_for
from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine
from omnistream.models.qwen3_omni.thinker.engine import ThinkerEngine
from omnistream.request.stage_chain import TalkerParams, ThinkerParams


async def _drain(outs: Iterable[AsyncIterable[Any]]) -> None:
    async def one(out: AsyncIterable[Any]) -> None:
        async for _ in out:
            pass

    await asyncio.gather(*(one(out) for out in outs))


def _recorder(engine: Engine[Any, Any], batch: int, times: list[float]) -> None:
    def listener(eng: Engine[Any, Any], seconds: float) -> None:
        if eng.stats.last_batch_size == batch:
            times.append(seconds)

    engine.add_step_listener(listener)


async def _thinker(engine: ThinkerEngine, batch: int) -> None:
    prompt = engine.encode_chat([{"role": "user", "content": "x " * 60}])
    outs = [engine.add_request(f"t{i}", prompt, ThinkerParams(64, True)) for i in range(batch)]
    await _drain(outs)


async def _talker(engine: TalkerEngine, prompt: list[int], batch: int) -> None:
    outs = []
    for i in range(batch):
        outs.append(engine.add_request(f"k{i}", TalkerParams(max_frames=48, ignore_eos=True)))
        engine.feed(f"k{i}", list(range(5, 69)), True, prompt_ids=prompt)
    await _drain(outs)


async def _code2wav(engine: Code2WavEngine, batch: int, decode: str = "stream") -> None:
    engine.set_decode(decode)  # between requests: the engine is idle here
    gen = torch.Generator().manual_seed(0)
    outs = []
    for i in range(batch):
        outs.append(engine.add_request(f"c{i}", ChunkPlan(25, 25, 25)))
        codes = torch.randint(0, engine.codebook_size, (engine.num_quantizers, 150), generator=gen)
        engine.feed(f"c{i}", codes, True)
    try:
        await _drain(outs)
    finally:
        engine.set_decode("stream")


async def stage_timings(
    model: str, batches: tuple[int, ...] = (1, 8), options: DeviceSettings = LoadOptions()
) -> dict[str, dict[int, float | None]]:
    """Median milliseconds per step of each engine at each batch size (one CPU thread: comparable
    between runs on a shared machine; on an accelerator the thread only queues work); None: no step
    of that batch size was timed."""
    torch.set_num_threads(1)
    family = family_for(model)
    batch = max(batches)
    engines = [
        family.engine(stage, model, derive(STAGE_SETTINGS[stage], options, max_batch=batch))
        for stage in STAGES
    ]
    # The transformers engines (the default backend): their step listeners are cleared below.
    thinker = cast(ThinkerEngine, engines[0])
    talker = cast(TalkerEngine, engines[1])
    code2wav = cast(Code2WavEngine, engines[2])
    prompt = thinker.encode_chat([{"role": "user", "content": "x " * 60}])
    result: dict[str, dict[int, float | None]] = {
        "thinker_ms_per_token": {},
        "talker_ms_per_frame": {},
        "code2wav_ms_per_chunk": {},
        "code2wav_recompute_ms_per_chunk": {},
    }
    runs: list[tuple[str, Engine[Any, Any], Callable[[int], Awaitable[None]]]] = [
        ("thinker_ms_per_token", thinker, lambda b: _thinker(thinker, b)),
        ("talker_ms_per_frame", talker, lambda b: _talker(talker, prompt, b)),
        ("code2wav_ms_per_chunk", code2wav, lambda b: _code2wav(code2wav, b)),
        ("code2wav_recompute_ms_per_chunk", code2wav, lambda b: _code2wav(code2wav, b, "recompute")),
    ]
    for engine in (thinker, talker, code2wav):
        engine.start()
    try:
        await _thinker(thinker, 1)  # warm-up
        for batch in batches:
            for key, timed, run in runs:
                times: list[float] = []
                _recorder(timed, batch, times)
                await run(batch)
                timed._step_listeners.clear()
                result[key][batch] = 1000 * statistics.median(times) if times else None
    finally:
        for engine in (thinker, talker, code2wav):
            engine.stop()
    return result
