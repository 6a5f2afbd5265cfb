"""The talker's step under a row cap: the request with the least buffered audio takes the step.

The engine is not started: each test steps it by hand (`plan_step` + `run_step`, as its thread does),
and sets the requests' playout clocks itself where the order must not depend on how fast this
machine runs, so every expected order is exact.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from omnistream.engine.chat_encoding import ChatEncoder
from omnistream.engine.playout import Playout
from omnistream.engine.settings import TalkerEngineSettings
from omnistream.models.qwen3_omni.checkpoint import load_tokenizer
from omnistream.models.qwen3_omni.talker.engine import TalkerEngine, TalkerParams

STREAM = [5, 6, 7, 8, 9, 10, 11, 12]  # thinker tokens after the prompt


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return TalkerEngine(
        tiny_model_dir,
        TalkerEngineSettings(
            dtype="float32", max_batch=3, max_model_len=256, max_step_batch=1, prefix_cache_gib=0
        ),
    )


@pytest.fixture
def talker(engine):
    """The engine, emptied (slots released, cap back to 1) however the test ends."""
    yield engine
    engine.max_step_batch = 1
    for rid in engine.request_ids():
        engine.abort(rid)
    engine.release_ended()


@pytest.fixture(scope="module")
def prompt(tiny_model_dir) -> list[int]:
    return ChatEncoder(load_tokenizer(tiny_model_dir), 256).encode([{"role": "user", "content": "hello"}])


def _step(engine: TalkerEngine) -> list[str]:
    """One step; the ids of the requests that got a frame in it."""
    before = {s.request_id: s.frames for s in engine.states()}
    work = engine.plan_step()
    assert work is not None, "the talker has no work"
    with torch.inference_mode():
        engine.run_step(work)
    return [s.request_id for s in engine.states() if s.frames > before[s.request_id]]


def _open(engine: TalkerEngine, prompt: list[int], *rids: str, frames: int = 60) -> None:
    for rid in rids:
        engine.add_request(rid, TalkerParams(max_frames=frames))
        engine.feed(rid, STREAM, True, prompt_ids=prompt)


def _prefill_all(engine: TalkerEngine) -> None:
    """Step until every request's prompt is in (beside frame steps of those already in)."""
    while not all(s.prefill_done for s in engine.states()):
        _step(engine)


def test_the_frame_step_goes_to_the_least_buffered_and_the_one_ahead_waits(talker, prompt):
    """Three running requests, one step row: r0 starts 5 frames ahead, so r1 and r2 take turns
    (a tie goes to the earlier arrival) until they have caught up, then all three rotate."""

    async def run():
        _open(talker, prompt, "r0", "r1", "r2")
        _prefill_all(talker)
        states = [talker.state(rid) for rid in ("r0", "r1", "r2")]
        start = time.monotonic() - 1000.0  # their first audio, long ago: the clocks are set here
        for state in states:
            state.playout = Playout(state.arrived, first_output=start)
        for _ in range(5):
            states[0].playout.emitted(talker.frame_seconds, start)
        deferred = talker.stats.deferred
        order = []
        for _ in range(13):
            order += _step(talker)
            assert talker.stats.last_deferred == 2  # both others could have stepped
            assert len(talker.stats.last_buffered) == 1
        assert talker.stats.deferred - deferred == 26
        return order

    order = asyncio.run(run())
    assert order == ["r1", "r2"] * 5 + ["r0", "r1", "r2"]


def test_a_new_request_goes_before_one_far_ahead_and_its_clock_starts_at_its_first_frame(talker, prompt):
    async def run():
        _open(talker, prompt, "ahead")
        _step(talker)  # its prefill
        ahead = talker.state("ahead")
        ahead.playout.emitted(1000.0, time.monotonic())  # a listener with 1000 s of audio buffered
        _open(talker, prompt, "new")
        order = []
        for _ in range(4):  # the first is the new one's prefill, beside the other's frame
            order.append(_step(talker))
        new = talker.state("new")
        clock = new.playout
        assert clock.first_output is not None and clock.first_output >= new.arrived
        assert clock.seconds_out == pytest.approx(new.frames * 0.08)
        return order

    order = asyncio.run(run())
    assert order == [["ahead"], ["new"], ["new"], ["new"]]


def test_without_a_cap_every_ready_request_steps_together(talker, prompt):
    async def run():
        _open(talker, prompt, "a", "b", "c")
        _prefill_all(talker)
        talker.max_step_batch = 3  # read by the scheduler each step: the default, max_batch
        stepped = _step(talker)
        assert talker.stats.last_deferred == 0
        assert len(talker.stats.last_buffered) == 3
        return stepped

    assert asyncio.run(run()) == ["a", "b", "c"]


def test_frame_seconds_and_cap_validation(talker, tiny_model_dir):
    assert talker.frame_seconds == pytest.approx(1920 / 24000)  # one codec frame: 80 ms
    with pytest.raises(ValueError, match="cannot exceed max_batch"):
        TalkerEngine(tiny_model_dir, TalkerEngineSettings(dtype="float32", max_batch=2, max_step_batch=3))
    with pytest.raises(ValueError, match="max_step_batch must be at least 1"):
        TalkerEngine(tiny_model_dir, TalkerEngineSettings(dtype="float32", max_batch=2, max_step_batch=0))


def test_while_a_playing_listener_is_near_dry_new_prompts_prefill_in_small_pieces(
    talker, prompt, tiny_model_dir
):
    from omnistream.models.qwen3_omni.talker.schedule import NEAR_DRY_S, URGENT_PREFILL_ROWS

    long_prompt = ChatEncoder(load_tokenizer(tiny_model_dir), 256).encode(
        [{"role": "user", "content": "hello there " * 30}]
    )

    async def run():
        talker.max_step_batch = 3
        _open(talker, prompt, "playing")
        _prefill_all(talker)
        state = talker.state("playing")
        _open(talker, long_prompt, "new")
        new = talker.state("new")
        # Its listener has little left and a prompt row costs 4 ms: the new prompt gets a small
        # piece this step (half of 0.1 s is 12 rows; never fewer than URGENT_PREFILL_ROWS).
        state.playout = Playout(state.arrived, first_output=time.monotonic(), seconds_out=0.1)
        talker.prefill_row_seconds = 0.004
        _step(talker)
        small = new.prefilled
        # Far from dry: the rest of the prompt goes in at the full budget.
        state.playout = Playout(state.arrived, first_output=time.monotonic(), seconds_out=10.0)
        _step(talker)
        return small, new.prefilled, new.prefill_done

    small, after, done = asyncio.run(run())
    assert NEAR_DRY_S > 0.1
    assert small == URGENT_PREFILL_ROWS
    assert done and after > URGENT_PREFILL_ROWS


def test_a_near_dry_listener_lets_in_as_many_prompt_rows_as_a_share_of_its_slack_affords(
    talker, prompt, tiny_model_dir
):
    """Prefill that is cheap beside the listener's slack goes in whole: a wave of new prompts is
    prefilled in one step, not one prompt every few steps."""
    from omnistream.models.qwen3_omni.talker.schedule import NEAR_DRY_S

    async def run():
        talker.max_step_batch = 3
        _open(talker, prompt, "playing")
        _prefill_all(talker)
        state = talker.state("playing")
        _open(talker, prompt, "n1", "n2")  # the KV slots left
        state.playout = Playout(state.arrived, first_output=time.monotonic(), seconds_out=NEAR_DRY_S / 2)
        talker.prefill_row_seconds = 1e-6  # measured cost: a microsecond a row
        _step(talker)
        return [talker.state(r).prefill_done for r in ("n1", "n2")]

    assert asyncio.run(run()) == [True, True]
