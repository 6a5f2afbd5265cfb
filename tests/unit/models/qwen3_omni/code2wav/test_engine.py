"""Code2Wav engine: streamed audio equals the one-shot decode whatever the chunk schedule, and
batching changes nothing."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from omnistream.engine.settings import Code2WavEngineSettings
from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
from omnistream.models.qwen3_omni.codec_chunks import SCHEDULES, ChunkPlan


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = Code2WavEngine(tiny_model_dir, Code2WavEngineSettings(dtype="float64", max_batch=8))
    e.start()
    yield e
    e.stop()


def _codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 2048, (16, frames), generator=torch.Generator().manual_seed(seed))


async def _stream(engine, rid: str, codes: torch.Tensor, plan: ChunkPlan, piece: int = 7) -> np.ndarray:
    out = engine.add_request(rid, plan)
    for start in range(0, codes.shape[1], piece):
        engine.feed(rid, codes[:, start : start + piece], last=start + piece >= codes.shape[1])
        await asyncio.sleep(0)
    chunks = [c.audio async for c in out]
    return np.concatenate(chunks)


def _full(engine, codes: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return engine.code2wav(codes[None]).reshape(-1).float().numpy()


@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("frames", [1, 3, 4, 5, 12, 28, 29, 30, 54, 97, 230])
def test_streamed_audio_equals_full_decode(engine, frames, schedule):
    codes = _codes(frames, seed=frames)
    plan = ChunkPlan(4, 25, 25, schedule)
    audio = asyncio.run(_stream(engine, f"len{frames}{schedule}", codes, plan))
    full = _full(engine, codes)
    assert audio.shape == full.shape
    np.testing.assert_allclose(audio, full, rtol=0, atol=1e-9)


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_audio_chunks_follow_the_schedule(engine, schedule):
    """One frame fed at a time: each audio chunk is one window of the plan, out as soon as its last
    frame is in (the decoder's 555-sample trim comes off the first)."""

    async def run():
        plan = ChunkPlan(2, 25, 25, schedule)
        out = engine.add_request(f"windows-{schedule}", plan)
        codes = _codes(70, seed=4)
        for frame in range(70):
            engine.feed(f"windows-{schedule}", codes[:, frame : frame + 1], last=frame == 69)
        return [c.audio.size async for c in out]

    sizes = asyncio.run(run())
    windows = {"grow": [2, 2, 4, 8, 16, 25, 13], "fixed": [2, 25, 25, 18]}[schedule]
    assert sizes == [windows[0] * 1920 - 555] + [n * 1920 for n in windows[1:]]


@pytest.mark.slow  # 45 s on 2 cores: the benchmark-only baseline, not a serving path
def test_recompute_baseline_is_approximate_and_improves_with_left_context(engine):
    """The old path, kept as the benchmark's baseline: right length, error falls with context."""
    codes = _codes(400, seed=7)
    full = _full(engine, codes)
    errors = {}
    engine.set_decode("recompute")
    try:
        for context in (25, 72, 150):
            plan = ChunkPlan(4, 25, context, "fixed")
            audio = asyncio.run(_stream(engine, f"ctx{context}", codes, plan, piece=25))
            assert audio.shape == full.shape
            errors[context] = float(np.abs(audio - full).max())
        # The growing schedule's windows through the recompute path: the right length, close.
        audio = asyncio.run(_stream(engine, "ctx-grow", codes, ChunkPlan(4, 25, 150, "grow"), piece=25))
        assert audio.shape == full.shape
        errors["grow, 150"] = float(np.abs(audio - full).max())
    finally:
        engine.set_decode("stream")
    print(f"\nrecompute max abs error vs full decode (400 frames), by left context: {errors}")
    assert errors[150] <= errors[25]
    assert errors[25] > 1e-9  # the error the exact stream removes
    assert errors["grow, 150"] <= errors[25]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_batched_windows_equal_solo_windows(engine, schedule):
    codes = [_codes(60 + 9 * i, seed=100 + i) for i in range(4)]
    # Rows at different points of their schedules share steps (a growing plan next to a fixed one).
    plans = [ChunkPlan(2, 25, 25, schedule), ChunkPlan(4, 25, 25, "fixed"), ChunkPlan(1, 25, 25, "grow")] * 2
    solo = [asyncio.run(_stream(engine, f"solo{i}", c, plans[i])) for i, c in enumerate(codes)]

    async def together():
        return await asyncio.gather(*(_stream(engine, f"b{i}", c, plans[i]) for i, c in enumerate(codes)))

    batched = asyncio.run(together())
    for a, b, c in zip(solo, batched, codes, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
        np.testing.assert_allclose(b, _full(engine, c), rtol=0, atol=1e-9)


def test_a_window_is_decoded_as_soon_as_its_last_frame_is_in(engine):
    async def run():
        out = engine.add_request("boundary", ChunkPlan(4, 25, 25))
        engine.feed("boundary", _codes(4, 1), last=False)  # window [0,4): no lookahead frame needed
        first = await out.get()
        engine.feed("boundary", None, last=True)  # nothing left to flush: just the end
        rest = [c async for c in out]
        return first, rest

    first, rest = asyncio.run(run())
    assert first.audio.size == 4 * 1920 - 555 and not first.finished
    assert [(r.audio.size, r.finished) for r in rest] == [(0, True)]
    assert engine.num_requests == 0


def test_a_failing_batched_step_fails_only_its_culprit(engine, monkeypatch):
    """Rows are retried alone after a failed batch (their states are untouched by it)."""
    step = engine.streamer.step_padded

    def poisoned(states, codes):
        if any(int(c[0, 0]) == 7 for c in codes):
            raise RuntimeError("poisoned frame")
        return step(states, codes)

    monkeypatch.setattr(engine.streamer, "step_padded", poisoned)
    good = [_codes(40, seed=200 + i) for i in range(3)]
    for c in good:
        c[0, 0] = 8
    bad = _codes(40, seed=300)
    bad[0, 0] = 7

    async def together():
        return await asyncio.gather(
            *(_stream(engine, f"ok{i}", c, ChunkPlan(4, 25, 25), piece=40) for i, c in enumerate(good)),
            _stream(engine, "culprit", bad, ChunkPlan(4, 25, 25), piece=40),
            return_exceptions=True,
        )

    *ok, failed = asyncio.run(together())
    assert isinstance(failed, Exception)
    for audio, c in zip(ok, good, strict=True):
        np.testing.assert_allclose(audio, _full(engine, c), rtol=0, atol=1e-9)
    assert engine.num_requests == 0


def test_bad_codes_are_rejected(engine):
    async def run():
        engine.add_request("bad", ChunkPlan())
        with pytest.raises(Exception, match="codes must be in"):
            engine.feed("bad", torch.full((16, 2), 5000), last=True)
        with pytest.raises(Exception, match="shape"):
            engine.feed("bad", torch.zeros((3, 2), dtype=torch.long), last=True)
        engine.abort("bad")

    asyncio.run(run())
    assert engine.num_requests == 0
