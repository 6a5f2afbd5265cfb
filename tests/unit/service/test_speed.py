"""A stage measures its own speed from its engine's steps and reports it in every Info (StageLoad)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from omnistream.engine.engine import Engine, RequestState
from omnistream.engine.stats import EngineStats
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.service.metrics import StageMetrics
from omnistream.service.speed import SpeedMeter
from omnistream.service.stage_service import StageServicer
from omnistream.wire.chunk_key import Stage


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def step(meter: SpeedMeter, clock: Clock, seconds: float, units: int, batch: int, idle: float = 0.0) -> None:
    """One engine step of `seconds` producing `units` at `batch`, after `idle` seconds of waiting."""
    clock.now += idle + seconds
    meter(SimpleNamespace(stats=EngineStats(last_units=units, last_batch_size=batch)), seconds)


def test_capacity_counts_busy_time_only_and_output_counts_wall_time():
    clock = Clock()
    meter = SpeedMeter(window=5.0, min_steps=4, clock=clock)
    for _ in range(40):  # batch 4, a 20 ms step each, then 80 ms waiting for input: 25% busy
        step(meter, clock, 0.02, units=4, batch=4, idle=0.08)
    speed = meter.speed()
    assert speed.capacity_per_second == pytest.approx(4 / 0.02)  # 200 frames per busy second
    assert speed.output_per_second == pytest.approx(40 * 4 / 5.0)  # 40 steps in the 5 s window
    assert speed.mean_batch == pytest.approx(4)
    assert speed.busy_fraction == pytest.approx(0.8 / 5.0)
    assert speed.measured_steps == 40


def test_steps_without_output_cost_time_and_do_not_dilute_the_batch():
    clock = Clock()
    meter = SpeedMeter(window=5.0, min_steps=1, clock=clock)
    step(meter, clock, 0.05, units=0, batch=0)  # a prefill-only step: it holds the streams up too
    step(meter, clock, 0.05, units=2, batch=2)
    speed = meter.speed()
    assert speed.capacity_per_second == pytest.approx(2 / 0.10)
    assert speed.mean_batch == pytest.approx(2)


def test_an_idle_engine_keeps_its_last_steps_and_reset_forgets_them():
    clock = Clock()
    meter = SpeedMeter(window=5.0, min_steps=3, clock=clock)
    assert meter.speed().measured_steps == 0 and meter.speed().capacity_per_second == 0
    for _ in range(10):
        step(meter, clock, 0.01, units=1, batch=1)
    clock.now += 60  # a quiet minute: nothing in the window
    speed = meter.speed()
    assert speed.output_per_second == 0 and speed.busy_fraction == 0
    assert speed.measured_steps == 3 and speed.capacity_per_second == pytest.approx(100)
    meter.reset()
    assert meter.speed().measured_steps == 0 and meter.speed().capacity_per_second == 0


class _Frames(Engine):
    """Each step emits one unit per request, three per request in all (a stand-in for the talker)."""

    name = "frames"

    def _schedule(self, candidates):
        return [s for s in candidates if not s.finished and s.output.has_room()] or None

    def _run(self, work) -> None:
        self.stats.last_batch_size = len(work)
        for state in work:
            state.sent = getattr(state, "sent", 0) + 1
            self.stats.last_units += 1
            state.output.put(state.sent)
            if state.sent == 3:
                self.finish(state)


class _Servicer(StageServicer):
    stage = Stage.TALKER
    input_stage = Stage.THINKER

    def _describe(self, info: stage_pb2.StageInfo) -> None:
        info.frames_per_second = 12.5


def test_the_info_rpc_reports_the_measured_speed_and_the_identity_stays_cached():
    engine = _Frames(max_requests=4)
    servicer = _Servicer(engine, StageMetrics("talker", engine))
    before = asyncio.run(servicer.Info(stage_pb2.InfoRequest(), None))
    assert before.HasField("load") and before.load.measured_steps == 0

    async def run() -> None:
        states = [RequestState(f"r{i}", engine.new_output()) for i in range(2)]
        for state in states:
            engine.admit(state)
        engine.start()
        for state in states:
            assert [item async for item in state.output] == [1, 2, 3]

    try:
        asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        engine.stop()
    info = asyncio.run(servicer.Info(stage_pb2.InfoRequest(), None))
    load = info.load
    assert load.measured_steps >= 3
    assert load.capacity_per_second > 0 and load.mean_batch >= 1
    assert load.output_per_second == pytest.approx(6 / load.window_seconds)  # 6 units, all recent
    assert (load.running, load.waiting) == (0, 0)
    assert info.frames_per_second == 12.5
    assert not servicer.info().HasField("load")  # the cached identity carries no stale load
    # The step-time model stands on the steps run (their sizes: 1 or 2 units a step).
    assert load.model_points >= 1 and load.step_unit_seconds + load.step_base_seconds > 0
    assert load.units_per_row == 1 and load.model_slowdown == 1.0


def test_the_probe_seeds_the_model_and_serving_keeps_it_past_a_reset():
    clock = Clock()
    meter = SpeedMeter(clock=clock)
    for rows in (1, 4, 16):  # the warm-up probe's steps
        step(meter, clock, 0.015 + 0.0025 * rows, rows, rows)
    meter.seed()
    seeded = meter.speed()
    assert seeded.measured_steps == 0  # the rolling measure starts anew
    assert seeded.fit.points == 3 and seeded.fit.step_seconds(16) == pytest.approx(0.055)
    meter.reset()  # forgets the steps, not the seed
    step(meter, clock, 2 * (0.015 + 0.0025 * 2), 2, 2)  # serving, twice as slow
    fit = meter.speed().fit
    assert fit.slowdown == pytest.approx(2.0) and fit.step_seconds(16) == pytest.approx(0.11, rel=0.05)


def test_a_step_that_prefilled_a_prompt_counts_for_the_rolling_measure_but_not_the_model():
    clock = Clock()
    meter = SpeedMeter(clock=clock)
    clock.now += 0.5
    meter(SimpleNamespace(stats=EngineStats(last_units=1, last_batch_size=1, last_prefill_rows=100)), 0.5)
    speed = meter.speed()
    assert speed.measured_steps == 1 and speed.fit is None
