"""The gateway core applying audio admission to the loads its replicas report: the first chunk
from measured speed, the hold of a stream that does not fit, unknown speeds, the hold turned off
(fake stage stubs; no stage runs)."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import generate_latest

from gateway.admission.audio_capacity import initial_frames_for
from gateway.admission.permits import Rejected
from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.chunk_plan import dynamic_initial_frames
from omnistream.request.generation import GenerationRequest
from tests.unit.gateway.infos import stage_info

FPS = 12.5


class FakeHealth:
    async def Check(self, request, timeout=None):
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class FakeStub:
    """A stage's Info: its identity, plus the load the test sets (None: a stage older than loads)."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        self.load: stage_pb2.StageLoad | None = None

    async def Info(self, request, timeout=None):
        info = stage_info(self.stage)
        if self.load is not None:
            info.load.CopyFrom(self.load)
        return info


def load(capacity: float, batch: float = 1.0) -> stage_pb2.StageLoad:
    return stage_pb2.StageLoad(
        capacity_per_second=capacity, output_per_second=capacity / 2, mean_batch=batch, measured_steps=32
    )


async def fake_core(**config) -> tuple[GatewayCore, dict[str, FakeStub]]:
    core = GatewayCore(
        GatewayConfig(thinker=["127.0.0.1:1"], talker=["127.0.0.1:2"], code2wav=["127.0.0.1:3"], **config)
    )
    stubs = {}
    for stage, replica_set in core.replicas.sets.items():
        (replica,) = replica_set.replicas
        replica.health, replica.stub = FakeHealth(), FakeStub(stage)
        stubs[stage] = replica.stub
    await core.replicas.check_all()
    assert core.ready
    return core, stubs


def audio(**fields) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": "hi"}], **fields)


async def close(core: GatewayCore) -> None:
    for replica_set in core.replicas.sets.values():
        for replica in replica_set.replicas:
            await replica.channel.close()


async def test_old_stages_without_a_load_give_todays_behaviour():
    core, _ = await fake_core(max_concurrency=4)
    try:
        assert core.planner.audio_capacity().headroom(1) is None
        assert core.planner.chunk_plan(audio()).initial == dynamic_initial_frames(0, 4)
        permits = [await core.admission.acquire(audio=True) for _ in range(4)]  # none held
        assert core.planner.chunk_plan(audio(), permits[-1]).initial == dynamic_initial_frames(3, 4)
        for permit in permits:
            permit.release()
    finally:
        await close(core)


async def test_measured_speeds_choose_the_first_chunk_and_hold_the_stream_that_does_not_fit(caplog):
    caplog.set_level(logging.WARNING, logger="gateway.admission.audio_planner")
    core, stubs = await fake_core(max_concurrency=16)
    try:
        stubs["talker"].load = load(60.0)  # 4.8 streams real time; 1.2x margin: 4 fit
        stubs["code2wav"].load = load(2000.0)
        stubs["thinker"].load = load(300.0)
        await core.replicas.check_all()  # the next health round reads the loads
        assert core.planner.audio_capacity().headroom(1) == pytest.approx(60 / FPS)
        plan = core.planner.chunk_plan
        assert plan(audio()).initial == initial_frames_for(60 / FPS, 25) == 2  # grows from 2
        assert plan(audio(codec_chunk_schedule="fixed")).initial == 8
        assert plan(audio(initial_codec_chunk_frames=3)).initial == 3  # the request's own wins
        playing = [await core.admission.acquire(audio=True) for _ in range(4)]
        assert core.planner.chunk_plan(audio(), playing[-1]).initial == 16  # 4 streams: 1.2x real time
        # A held speculation released 1.5 s from now: what is made meanwhile (1.8 s) is in hand.
        assert core.planner.chunk_plan(audio(), playing[-1], head_start=1.5).initial == 2
        held = asyncio.create_task(core.admission.acquire(audio=True))
        await asyncio.sleep(0.01)
        assert not held.done()
        text = await asyncio.wait_for(core.admission.acquire(audio=False), 1)  # text passes
        text.release()
        scraped = generate_latest(core.metrics.registry).decode()
        assert 'omnistream_stage_capacity_per_second{stage="talker"} 60.0' in scraped
        assert 'omnistream_stage_capacity_per_second{stage="thinker"} 300.0' in scraped
        assert "omnistream_requests_audio_waiting 1.0" in scraped
        assert 'omnistream_requests_audio_held_total{reason="capacity"} 1.0' in scraped
        # No step-time model reported: the capacity assumed with one more stream is the measured one.
        assert 'omnistream_audio_assumed_capacity_per_second{stage="talker"} 60.0' in scraped
        # One log line for the held request: why, and the speeds the decision stood on.
        (line,) = [r.getMessage() for r in caplog.records if "held for audio" in r.getMessage()]
        assert "(capacity): 4 streams playing" in line and "needs 1.20" in line
        assert "talker assumed 60 frames/s, measured 60 frames/s" in line
        assert "omnistream_audio_streams 4.0" in scraped
        stubs["talker"].load = load(200.0, batch=4)  # faster now (a larger batch measured better)
        await core.replicas.check_all()  # the health round re-checks who waits
        (await asyncio.wait_for(held, 1)).release()
        for permit in playing:
            permit.release()
    finally:
        await close(core)


async def test_a_failed_load_read_makes_the_speed_unknown_and_the_identity_keeps_no_load():
    core, stubs = await fake_core()
    try:
        stubs["talker"].load = load(60.0)
        await core.replicas.check_all()
        assert core.planner.stage_capacity("talker") == 60.0
        (talker,) = core.replicas.sets["talker"].replicas
        assert not talker.info.HasField("load")  # what the deployment judged and Gateway/Info shows

        async def broken(request, timeout=None):
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "gone for a moment")

        stubs["talker"].Info = broken
        await core.replicas.check_all()
        assert talker.in_rotation  # only health decides that
        assert core.planner.stage_capacity("talker") is None
        assert core.planner.audio_capacity().headroom(1) is None
    finally:
        await close(core)


async def test_the_hold_can_be_turned_off():
    core, stubs = await fake_core(max_concurrency=4, audio_hold=False)
    try:
        stubs["talker"].load = load(1.0)  # far too slow for a second stream
        await core.replicas.check_all()
        permits = [await asyncio.wait_for(core.admission.acquire(audio=True), 1) for _ in range(4)]
        for permit in permits:
            permit.release()
    finally:
        await close(core)


async def test_a_wave_is_sized_together_up_to_what_the_hold_lets_play():
    """Requests arriving together count themselves in before any is sized, so the first of a wave
    gets the first chunk of the wave's size, not of a stream alone; no more than the hold admits."""
    core, stubs = await fake_core(max_concurrency=16)
    try:
        stubs["talker"].load = load(200.0)  # 16 streams real time; 1.2x margin: 13 fit
        stubs["code2wav"].load = load(5000.0)
        await core.replicas.check_all()
        alone = core.planner.chunk_plan(audio()).initial
        seen: list[tuple[int, int]] = []

        async def acquire(audio=False, request_id=None):
            seen.append((core.planner.audio_arriving, core.planner.sizing_streams()))
            raise Rejected("stop here", "test", 1)

        core.admission.acquire = acquire  # type: ignore[method-assign]
        wave = (core.open(audio(max_audio_frames=100)) for _ in range(16))
        results = await asyncio.gather(*wave, return_exceptions=True)
        assert all(isinstance(r, Rejected) for r in results), results[:2]
        # The first to reach admission already sees the 15 others on their way in.
        assert seen[0] == (15, 13)
        assert core.planner.audio_arriving == 0  # every way out of `open` counts itself out
        core.planner.audio_arriving = 15
        assert core.planner.chunk_plan(audio()).initial > alone
        assert core.planner.sizing_streams() == 13
        core.planner.audio_arriving = 0
        assert core.planner.sizing_streams() == 1 and core.planner.chunk_plan(audio()).initial == alone
    finally:
        await close(core)


async def test_without_the_hold_a_wave_is_sized_up_to_max_concurrency():
    core, stubs = await fake_core(max_concurrency=8, audio_hold=False)
    try:
        stubs["talker"].load = load(100.0)
        await core.replicas.check_all()
        core.planner.audio_arriving = 20
        assert core.planner.sizing_streams() == 8
    finally:
        await close(core)
