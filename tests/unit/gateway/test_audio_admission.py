"""Audio admission by measured speed: the rule, the hold queue, and the gateway core that applies
them to the loads its replicas report (fake speeds; no stage runs)."""

from __future__ import annotations

import asyncio
import math

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import generate_latest

from gateway.admission import Admission, Rejected
from gateway.audio_capacity import (
    AudioCapacity,
    ReplicaSpeed,
    chunk_sizes,
    code2wav_pause,
    initial_frames_for,
    measured_capacity,
    predicted_stalls,
    replica_speeds,
)
from gateway.config import GatewayConfig
from gateway.core import GatewayCore
from gateway.rest_errors import error_response
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.chunk_plan import ChunkPlan, dynamic_initial_frames
from omnistream.request.generation import GenerationRequest
from tests.unit.gateway.infos import stage_info

FPS = 12.5


# --- the rule ---------------------------------------------------------------------------------------


def one(capacity: float, batch: float = 1.0) -> AudioCapacity:
    """One audio stage with one replica measured at `capacity` frames per busy second, `batch`."""
    return AudioCapacity.of([[ReplicaSpeed(capacity, batch)]], FPS)


def test_headroom_is_capacity_over_the_streams_real_time_need():
    capacity = one(100.0)
    assert capacity.headroom(1) == pytest.approx(8.0)
    assert capacity.headroom(4) == pytest.approx(2.0)
    assert capacity.headroom(0) == math.inf
    assert AudioCapacity.of([None, None], FPS).headroom(3) is None


def test_below_the_measured_batch_a_stream_is_assumed_no_faster_than_it_was_measured():
    # 100 frames/s at batch 4 is 25 frames/s per stream: one stream alone is not assumed to get 100
    capacity = one(100.0, batch=4)
    assert capacity.headroom(1) == pytest.approx(2.0)
    assert capacity.headroom(4) == pytest.approx(2.0)
    assert capacity.headroom(8) == pytest.approx(1.0)  # past it, the capacity is shared


def test_replicas_share_the_streams_and_the_slowest_one_and_the_tighter_stage_count():
    two = AudioCapacity.of([[ReplicaSpeed(100.0), ReplicaSpeed(50.0)]], FPS)
    assert two.headroom(4) == pytest.approx(50 / 2 / FPS)  # 2 streams each; the slow one: 25 frames/s
    both = AudioCapacity.of([[ReplicaSpeed(100.0)], [ReplicaSpeed(1000.0)]], FPS)
    assert both.headroom(2) == pytest.approx(100 / 2 / FPS)
    assert AudioCapacity.of([None, [ReplicaSpeed(300.0)]], 0.0) == one(300.0)  # an unknown stage: the other


def test_one_more_stream_is_admitted_only_with_the_margin_to_spare():
    capacity = one(100.0)  # 8 streams exactly real time
    assert capacity.admits(5, margin=0.2)  # 6 streams: 1.33x real time each
    assert not capacity.admits(6, margin=0.2)  # 7 streams: 1.14x < 1.2x
    assert capacity.admits(6, margin=0.1)
    assert not capacity.admits(8, margin=0.0)  # 9 streams would be below real time
    assert one(1.0).admits(0)  # the first stream always starts
    assert AudioCapacity().admits(1000)  # unknown speed: never held


def test_under_the_fixed_schedule_the_first_chunk_grows_as_headroom_shrinks():
    assert chunk_sizes(25) == [2, 4, 8, 16]
    # the next 25 frames must be ready when the first chunk (less the decoder's holdback) has played
    assert initial_frames_for(math.inf, 25, "fixed") == 2
    assert initial_frames_for(20.0, 25, "fixed") == 2
    assert initial_frames_for(12.5, 25, "fixed") == 4  # 2 frames less 25 ms play 135 ms < 27 / 156 s
    assert initial_frames_for(4.0, 25, "fixed") == 8
    assert initial_frames_for(2.0, 25, "fixed") == 16
    assert initial_frames_for(1.2, 25, "fixed") == 16  # nothing suffices: the largest
    assert initial_frames_for(0.0, 25, "fixed") == 16
    assert initial_frames_for(3.0, 2, "fixed") == 1  # a chunk too small for any of the sizes


def test_a_growing_schedule_keeps_the_first_chunk_small_while_doubling_stays_ahead():
    for headroom in (math.inf, 12.0, 4.0, 3.0, 2.0):
        assert initial_frames_for(headroom, 25, "grow") == 2
    assert initial_frames_for(1.6, 25, "grow") == 8  # 2 then 2 frames would run dry before the 4
    assert initial_frames_for(1.4, 25, "grow") == 16  # barely faster than real time: buffer first
    assert initial_frames_for(0.0, 25, "grow") == 16


def test_the_predicted_listener_is_the_listener_model():
    # At 3x real time a fixed plan of 2 then 25 frames: the 25 arrive at 27 / 37.5 = 0.72 s, the
    # first 2 (0.135 s of audio) arrived at 0.053 s and ran out at 0.188 s: one stall.
    assert predicted_stalls(3.0, ChunkPlan(2, 25, schedule="fixed")) == 1
    assert predicted_stalls(3.0, ChunkPlan(2, 25, schedule="grow")) == 0
    assert predicted_stalls(0.0, ChunkPlan(2, 25)) > 0


def test_the_speed_of_a_stage_is_known_only_when_every_replica_in_rotation_measured_it():
    class R:
        def __init__(self, load, in_rotation=True):
            self.load, self.in_rotation = load, in_rotation

    measured = stage_pb2.StageLoad(capacity_per_second=80.0, mean_batch=2.0, measured_steps=20)
    assert replica_speeds([R(measured), R(measured)]) == [ReplicaSpeed(80.0, 2.0)] * 2
    assert measured_capacity([R(measured), R(measured)]) == 160.0
    assert measured_capacity([R(measured), R(None, in_rotation=False)]) == 80.0
    assert measured_capacity([R(measured), R(None)]) is None  # an old stage beside a new one
    assert measured_capacity([R(stage_pb2.StageLoad())]) is None  # nothing measured since warm-up
    assert measured_capacity([]) is None


# --- the hold queue ----------------------------------------------------------------------------------


class Gate:
    """A fake audio gate: admits while fewer than `fits` audio streams run (None: unknown, admits)."""

    def __init__(self, fits: int | None) -> None:
        self.fits = fits

    def __call__(self, running: int) -> bool:
        return self.fits is None or running < self.fits


async def test_ample_headroom_admits_at_once():
    admission = Admission(16, audio_gate=Gate(8))
    permits = [await admission.acquire(audio=True) for _ in range(8)]
    assert admission.audio_active == 8 and admission.active == 8 and admission.audio_held == 0
    for permit in permits:
        permit.release()
    assert admission.audio_active == 0 and admission.active == 0


async def test_no_headroom_holds_then_admits_when_a_stream_ends():
    held: list[int] = []
    admission = Admission(16, audio_gate=Gate(2), on_hold=lambda: held.append(1))
    first, second = await admission.acquire(audio=True), await admission.acquire(audio=True)
    third = asyncio.create_task(admission.acquire(audio=True))
    await asyncio.sleep(0.01)
    assert not third.done() and admission.audio_held == 1 and held == [1]
    assert admission.active == 2  # a held request takes no concurrency slot
    first.release()
    permit = await asyncio.wait_for(third, 1)
    assert permit.audio and admission.audio_active == 2 and admission.audio_held == 0
    second.release()
    permit.release()
    assert (admission.active, admission.audio_active) == (0, 0)


async def test_a_fragile_stream_holds_new_audio_starts_and_lets_them_in_together_when_it_settles():
    admission = Admission(16, audio_gate=Gate(None))
    first = await admission.acquire(audio=True)
    first.mark_starting()
    assert admission.audio_starting == 1
    waves = [asyncio.create_task(admission.acquire(audio=True)) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert admission.audio_held == 5 and not any(w.done() for w in waves)
    text = await asyncio.wait_for(admission.acquire(audio=False), 1)  # text never waits for the guard
    text.release()
    first.settle()
    # All five in at once, each counted in before it resumes: each sizes its first chunk knowing the rest.
    assert admission.audio_active == 6 and admission.audio_held == 0
    permits = [await asyncio.wait_for(w, 1) for w in waves]
    for permit in [first, *permits]:
        permit.release()
    assert (admission.active, admission.audio_active, admission.audio_starting) == (0, 0, 0)


async def test_the_guard_waits_for_every_fragile_stream_and_an_ended_one_counts_as_settled():
    admission = Admission(16, audio_gate=Gate(None))
    a, b = await admission.acquire(audio=True), await admission.acquire(audio=True)
    a.mark_starting()
    b.mark_starting()
    b.mark_starting()  # counted once
    held = asyncio.create_task(admission.acquire(audio=True))
    await asyncio.sleep(0.01)
    a.settle()
    await asyncio.sleep(0.01)
    assert not held.done()  # b is still fragile
    b.release()  # ending settles it
    permit = await asyncio.wait_for(held, 1)
    assert admission.audio_starting == 0
    for p in (a, permit):
        p.release()
    a.settle()  # settling twice or after release changes nothing
    assert (admission.active, admission.audio_active, admission.audio_starting) == (0, 0, 0)


async def test_the_guard_is_part_of_the_audio_hold():
    admission = Admission(16)  # no audio gate: the hold is off, and so is the guard
    first = await admission.acquire(audio=True)
    first.mark_starting()
    second = await asyncio.wait_for(admission.acquire(audio=True), 1)
    for permit in (first, second):
        permit.release()


async def test_a_new_measure_lets_a_held_request_in():
    gate = Gate(1)
    admission = Admission(16, audio_gate=gate)
    playing = await admission.acquire(audio=True)
    held = asyncio.create_task(admission.acquire(audio=True))
    await asyncio.sleep(0.01)
    admission.reconsider()  # nothing changed: still held
    await asyncio.sleep(0.01)
    assert not held.done()
    gate.fits = 2  # the stages report more speed
    admission.reconsider()
    (await asyncio.wait_for(held, 1)).release()
    playing.release()


async def test_text_only_requests_are_never_held_for_audio():
    admission = Admission(4, audio_gate=Gate(1))
    playing = await admission.acquire(audio=True)
    held = asyncio.create_task(admission.acquire(audio=True))
    await asyncio.sleep(0.01)
    text = await asyncio.wait_for(admission.acquire(audio=False), 1)  # passes the held one
    assert not held.done() and admission.active == 2
    text.release()
    playing.release()
    (await asyncio.wait_for(held, 1)).release()


async def test_past_the_hold_bound_and_after_the_timeout_rejected_with_retry_after():
    admission = Admission(16, queue_timeout=0.05, retry_after=3, audio_gate=Gate(1), max_audio_hold=1)
    playing = await admission.acquire(audio=True)
    waiting = asyncio.create_task(admission.acquire(audio=True))
    await asyncio.sleep(0.01)
    with pytest.raises(Rejected) as full:
        await admission.acquire(audio=True)
    assert full.value.reason == "audio_hold_full"
    response = error_response(full.value)
    assert response.status_code == 429 and response.headers["Retry-After"] == "3"
    with pytest.raises(Rejected) as late:
        await waiting
    assert late.value.reason == "audio_hold_timeout" and admission.audio_held == 0
    assert (admission.active, admission.audio_active) == (1, 1)  # nothing leaked
    playing.release()
    refuse = Admission(16, audio_gate=Gate(1), max_audio_hold=0)
    kept = await refuse.acquire(audio=True)
    with pytest.raises(Rejected) as at_once:
        await refuse.acquire(audio=True)
    assert at_once.value.reason == "audio_capacity"
    kept.release()


async def test_a_held_request_that_goes_away_leaves_nothing_behind():
    admission = Admission(16, audio_gate=Gate(1))
    playing = await admission.acquire(audio=True)
    held = asyncio.create_task(admission.acquire(audio=True))
    await asyncio.sleep(0.01)
    held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    playing.release()
    assert (admission.active, admission.audio_active, admission.audio_held) == (0, 0, 0)


async def test_the_concurrency_bound_refuses_at_once_without_an_audio_wait():
    admission = Admission(1, queue_timeout=5, audio_gate=Gate(0))  # no audio room at all...
    text = await admission.acquire()
    with pytest.raises(Rejected) as exc:  # ...but the slots are full: 429 now, as before
        await asyncio.wait_for(admission.acquire(audio=True), 1)
    assert exc.value.reason == "concurrency"
    text.release()


async def test_no_gate_is_todays_admission():
    admission = Admission(2)
    permits = [await admission.acquire(audio=True) for _ in range(2)]
    with pytest.raises(Rejected) as exc:
        await admission.acquire(audio=True)
    assert exc.value.reason == "concurrency"
    for permit in permits:
        permit.release()


# --- the gateway core: loads from the replicas --------------------------------------------------------


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
        assert core.audio_capacity().headroom(1) is None
        assert core.chunk_plan(audio()).initial == dynamic_initial_frames(0, 4)
        permits = [await core.admission.acquire(audio=True) for _ in range(4)]  # none held
        assert core.chunk_plan(audio(), permits[-1]).initial == dynamic_initial_frames(3, 4)
        for permit in permits:
            permit.release()
    finally:
        await close(core)


async def test_measured_speeds_choose_the_first_chunk_and_hold_the_stream_that_does_not_fit():
    core, stubs = await fake_core(max_concurrency=16)
    try:
        stubs["talker"].load = load(60.0)  # 4.8 streams real time; 1.2x margin: 4 fit
        stubs["code2wav"].load = load(2000.0)
        stubs["thinker"].load = load(300.0)
        await core.replicas.check_all()  # the next health round reads the loads
        assert core.audio_capacity().headroom(1) == pytest.approx(60 / FPS)
        assert core.chunk_plan(audio()).initial == initial_frames_for(60 / FPS, 25) == 2  # grows from 2
        assert core.chunk_plan(audio(codec_chunk_schedule="fixed")).initial == 8
        assert core.chunk_plan(audio(initial_codec_chunk_frames=3)).initial == 3  # the request's own wins
        playing = [await core.admission.acquire(audio=True) for _ in range(4)]
        assert core.chunk_plan(audio(), playing[-1]).initial == 16  # 4 streams: 1.2x real time
        held = asyncio.create_task(core.admission.acquire(audio=True))
        await asyncio.sleep(0.01)
        assert not held.done()
        text = await asyncio.wait_for(core.admission.acquire(audio=False), 1)  # text passes
        text.release()
        scraped = generate_latest(core.metrics.registry).decode()
        assert 'omnistream_stage_capacity_per_second{stage="talker"} 60.0' in scraped
        assert 'omnistream_stage_capacity_per_second{stage="thinker"} 300.0' in scraped
        assert "omnistream_requests_audio_waiting 1.0" in scraped
        assert "omnistream_requests_audio_held_total 1.0" in scraped
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
        assert core.stage_capacity("talker") == 60.0
        (talker,) = core.replicas.sets["talker"].replicas
        assert not talker.info.HasField("load")  # what the deployment judged and Gateway/Info shows

        async def broken(request, timeout=None):
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None, "gone for a moment")

        stubs["talker"].Info = broken
        await core.replicas.check_all()
        assert talker.in_rotation  # only health decides that
        assert core.stage_capacity("talker") is None and core.audio_capacity().headroom(1) is None
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


def test_the_other_streams_windows_at_code2wav_make_a_new_stream_start_with_more_audio():
    # Alone, or with Code2Wav's speed unknown, nothing waits ahead of the new stream's windows.
    assert code2wav_pause(1, 25, 450.0) == 0.0 and code2wav_pause(8, 25, None) == 0.0
    # Three others' 25-frame windows at 450 frames per busy second: 1/6 s.
    assert code2wav_pause(4, 25, 450.0) == pytest.approx(75 / 450)
    assert initial_frames_for(4.0, 25, "grow") == 2
    assert initial_frames_for(4.0, 25, "grow", pause=code2wav_pause(4, 25, 450.0)) == 4
    assert initial_frames_for(4.0, 25, "grow", pause=code2wav_pause(16, 25, 450.0)) == 16
    plan = ChunkPlan(2, 25)
    assert predicted_stalls(4.0, plan) == 0 and predicted_stalls(4.0, plan, pause=0.2) == 1
