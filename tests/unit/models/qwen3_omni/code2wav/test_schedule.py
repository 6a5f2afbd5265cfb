"""Code2Wav's step under its budgets (max_batch windows, max_step_frames frames): the windows of the
requests with the least buffered audio go first, the most urgent at the head of the batch.

The engine is not started: each test steps it by hand (`plan_step` + `run_step`, as its thread does)
and sets the requests' playout clocks itself, so every expected order is exact.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from omnistream.engine.playout import Playout
from omnistream.engine.settings import Code2WavEngineSettings
from omnistream.models.qwen3_omni.code2wav.engine import Code2WavEngine
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan

PLAN = ChunkPlan(4, 8, 8, "fixed")  # a first window of 4 frames, then 8 each


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return Code2WavEngine(tiny_model_dir, Code2WavEngineSettings(dtype="float32", max_batch=2))


@pytest.fixture
def c2w(engine):
    """The engine, emptied and back to its budgets however the test ends."""
    yield engine
    engine.max_batch = 2
    engine.max_step_frames = None
    for rid in engine.request_ids():
        engine.abort(rid)
    engine.release_ended()


def _open(engine: Code2WavEngine, *rids: str, frames: int = 80) -> None:
    gen = torch.Generator().manual_seed(0)
    for rid in rids:
        engine.add_request(rid, PLAN)
        engine.feed(rid, torch.randint(0, 2048, (16, frames), generator=gen), last=False)


def _set_buffered(engine: Code2WavEngine, seconds: dict[str, float]) -> None:
    """Clocks that started long ago, with `seconds` of audio out: the order is theirs alone."""
    start = time.monotonic() - 1000.0
    for rid, out in seconds.items():
        state = engine.state(rid)
        state.playout = Playout(state.arrived, first_output=start, seconds_out=out)


def _step(engine: Code2WavEngine) -> list[str]:
    """One step; the requests its batch decodes, in batch order."""
    work = engine.plan_step()
    assert work is not None, "code2wav has no work"
    with torch.inference_mode():
        engine.run_step(work)
    return [state.request_id for state, _, _ in work]


def test_the_least_buffered_windows_go_first_and_the_rest_wait(c2w):
    async def run():
        _open(c2w, "ahead", "middle", "behind")
        _set_buffered(c2w, {"ahead": 10.0, "middle": 0.5, "behind": 0.2})
        deferred = c2w.stats.deferred
        first = _step(c2w)
        assert c2w.stats.last_deferred == 1 and c2w.stats.deferred - deferred == 1
        assert len(c2w.stats.last_buffered) == 2
        _set_buffered(c2w, {"ahead": 10.0, "middle": 0.1, "behind": 0.3})
        second = _step(c2w)
        _set_buffered(c2w, {"ahead": 0.0, "middle": 0.1, "behind": 0.3})
        third = _step(c2w)
        return first, second, third

    first, second, third = asyncio.run(run())
    assert first == ["behind", "middle"]  # most urgent first; "ahead" waits
    assert second == ["middle", "behind"]
    # ahead's 4-frame first window is the most urgent: the others' 8 frames would pad it to 8.
    assert third == ["ahead"]


def test_a_longer_window_waits_for_a_step_of_its_own_instead_of_padding_the_most_urgent(c2w):
    async def run():
        c2w.max_batch = 3
        _open(c2w, "old")
        _step(c2w)  # its first window: the next one is 8 frames
        _open(c2w, "new", "newer")
        _set_buffered(c2w, {"old": 1.0, "new": 0.0, "newer": 0.1})
        urgent = _step(c2w)  # the new ones' 4-frame windows; old's 8 would pad them
        assert c2w.stats.last_deferred == 1
        _set_buffered(c2w, {"old": 0.0, "new": 1.0, "newer": 1.0})
        padded = _step(c2w)  # old's 8 frames go first now: the shorter ones may join
        return urgent, padded

    urgent, padded = asyncio.run(run())
    assert urgent == ["new", "newer"]
    assert padded == ["old", "new", "newer"]


def test_a_frame_budget_takes_the_most_urgent_window_however_long_then_what_fits(c2w):
    async def run():
        c2w.max_batch = 3
        _open(c2w, "a", "b", "c")
        _step(c2w)  # every first window (4 frames): the next ones are 8 frames each
        c2w.max_step_frames = 6
        _set_buffered(c2w, {"a": 0.3, "b": 0.2, "c": 0.1})
        alone = _step(c2w)  # c's 8 frames exceed the budget: it goes, and alone
        assert c2w.stats.last_deferred == 2
        _open(c2w, "d")  # its first window: 4 frames
        c2w.max_step_frames = 12
        _set_buffered(c2w, {"a": 0.3, "b": 0.2, "c": 5.0, "d": 0.4})
        filled = _step(c2w)  # b (8) leaves 4: a's 8 do not fit, d's 4 do
        return alone, filled

    alone, filled = asyncio.run(run())
    assert alone == ["c"]
    assert filled == ["b", "d"]


def test_the_clock_starts_at_the_first_audio_and_counts_samples(c2w):
    async def run():
        _open(c2w, "fresh")
        state = c2w.state("fresh")
        assert state.playout.first_output is None
        assert state.playout.deadline() == pytest.approx(state.arrived + 0.5)  # the default target
        _step(c2w)
        _step(c2w)
        return state

    state = asyncio.run(run())
    assert state.playout.first_output is not None and state.playout.first_output >= state.arrived
    assert state.samples > 0
    assert state.playout.seconds_out == pytest.approx(state.samples / 24000)


def test_a_frame_budget_must_be_positive(tiny_model_dir):
    with pytest.raises(ValueError, match="max_step_frames must be at least 1"):
        Code2WavEngine(tiny_model_dir, Code2WavEngineSettings(dtype="float32", max_step_frames=0))
