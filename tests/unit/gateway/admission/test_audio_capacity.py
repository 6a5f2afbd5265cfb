"""The audio admission rule and the first-chunk prediction (gateway/admission/audio_capacity.py): headroom
from measured speeds, who may start, and how long a new stream's first chunk must be. Pure: fake
speeds, no stage runs."""

from __future__ import annotations

import math

import pytest

from gateway.admission.audio_capacity import (
    DEFAULT_START_JITTER_S,
    AudioCapacity,
    ReplicaSpeed,
    chunk_sizes,
    code2wav_pause,
    headroom_needed,
    initial_frames_for,
    measured_capacity,
    predicted_stalls,
    replica_speed,
    replica_speeds,
)
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.service.step_model import StepFit

FPS = 12.5


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
    assert initial_frames_for(math.inf, 25, "fixed", jitter=0.0) == 2
    assert initial_frames_for(20.0, 25, "fixed", jitter=0.0) == 2
    # the fixed schedule's 25-frame second window: one size longer at ~8x real time
    assert initial_frames_for(8.0, 25, "fixed", jitter=0.0) == 4
    assert initial_frames_for(8.0, 25, "fixed") == 8
    assert initial_frames_for(1.2, 25, "fixed", jitter=0.0) == 16  # nothing suffices: the largest
    assert initial_frames_for(0.0, 25, "fixed", jitter=0.0) == 16
    assert initial_frames_for(3.0, 2, "fixed", jitter=0.0) == 1  # a chunk too small for any of the sizes


def test_a_growing_schedule_keeps_the_first_chunk_small_while_doubling_stays_ahead():
    for headroom in (math.inf, 12.0, 4.0, 3.0, 2.0):
        assert initial_frames_for(headroom, 25, "grow", jitter=0.0) == 2
    assert initial_frames_for(1.6, 25, "grow", jitter=0.0) == 8  # 2 then 2 frames would run dry before the 4
    assert initial_frames_for(1.4, 25, "grow", jitter=0.0) == 16  # barely faster than real time: buffer first
    assert initial_frames_for(0.0, 25, "grow", jitter=0.0) == 16


def test_the_predicted_listener_is_the_listener_model():
    # At 3x real time a fixed plan of 2 then 25 frames: the 25 arrive at 27 / 37.5 = 0.72 s, the
    # first 2 (0.135 s of audio) arrived at 0.053 s and ran out at 0.188 s: one stall.
    assert predicted_stalls(3.0, ChunkPlan(2, 25, schedule="fixed")) == 1
    assert predicted_stalls(3.0, ChunkPlan(2, 25, schedule="grow")) == 0
    assert predicted_stalls(0.0, ChunkPlan(2, 25)) > 0


def test_a_listener_who_starts_later_needs_a_smaller_first_chunk():
    """A held speculation plays from its release: what the stages made before it is in hand."""
    # 3x real time, 2 then 25 frames: the 25 arrive at 0.72 s; a listener who starts at 0.7 s has
    # the first 2 frames to play past it.
    assert predicted_stalls(3.0, ChunkPlan(2, 25, schedule="fixed"), head_start=0.7) == 0
    assert initial_frames_for(8.0, 25, "fixed") == 8
    assert initial_frames_for(8.0, 25, "fixed", head_start=0.3) == 2
    plan = ChunkPlan(2, 25, schedule="fixed")
    assert headroom_needed(plan, head_start=0.3) < headroom_needed(plan)


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


def test_the_other_streams_windows_at_code2wav_make_a_new_stream_start_with_more_audio():
    # Alone, or with Code2Wav's speed unknown, nothing waits ahead of the new stream's windows.
    assert code2wav_pause(1, 25, 450.0) == 0.0 and code2wav_pause(8, 25, None) == 0.0
    # Three others' 25-frame windows at 450 frames per busy second: 1/6 s.
    assert code2wav_pause(4, 25, 450.0) == pytest.approx(75 / 450)
    assert initial_frames_for(4.0, 25, "grow", jitter=0.0) == 2
    assert initial_frames_for(4.0, 25, "grow", pause=code2wav_pause(4, 25, 450.0), jitter=0.0) == 4
    assert initial_frames_for(4.0, 25, "grow", pause=code2wav_pause(16, 25, 450.0), jitter=0.0) == 16
    plan = ChunkPlan(2, 25)
    assert predicted_stalls(4.0, plan) == 0 and predicted_stalls(4.0, plan, pause=0.2) == 1


def test_the_start_jitter_allowance_lengthens_the_first_chunk_only_where_speed_alone_is_tight():
    """A starting stream's later windows are predicted `jitter` later (module docstring): on the
    2-core machine one starting stream in ~16 at concurrency 4 had its second window 40-170 ms late
    and stalled with the 2 frames speed alone allowed."""
    assert DEFAULT_START_JITTER_S == 0.1
    plan = ChunkPlan(2, 25)
    # the allowance is a later arrival of every window after the first, as a pause is
    for headroom in (3.0, 4.0, 6.0):
        assert predicted_stalls(headroom, plan, jitter=0.1) == predicted_stalls(headroom, plan, pause=0.1)
    # one stream alone on this machine (~7x real time): still 2 frames, TTFP unchanged
    assert initial_frames_for(7.0, 25, "grow") == initial_frames_for(7.0, 25, "grow", jitter=0.0) == 2
    # 2 then 2 frames need ~4.6x with 0.1 s to spare; below it the first chunk is 4
    assert initial_frames_for(4.7, 25, "grow") == 2
    for headroom in (2.0, 3.0, 4.0, 4.5):
        assert initial_frames_for(headroom, 25, "grow", jitter=0.0) == 2
        assert initial_frames_for(headroom, 25, "grow") == 4
    assert initial_frames_for(1.4, 25, "grow") == 16  # nothing suffices either way: the largest
    # the fixed schedule's 25-frame second window: one size longer at ~8x real time
    assert initial_frames_for(8.0, 25, "fixed", jitter=0.0) == 4
    assert initial_frames_for(8.0, 25, "fixed") == 8


def test_a_stage_with_a_step_time_model_is_judged_at_the_batch_the_new_stream_makes():
    """15 ms a step plus 2.5 ms a row: 16 streams get 1 / 55 ms = 18 frames/s each (headroom 1.45),
    where the old rule, from the 4.5 streams of capacity measured at batch 2, said 0.56."""
    load = stage_pb2.StageLoad(
        capacity_per_second=2 / 0.02,
        mean_batch=2.0,
        measured_steps=40,
        step_base_seconds=0.015,
        step_unit_seconds=0.0025,
        units_per_row=1.0,
        model_points=3,
    )
    speed = replica_speed(load)
    capacity = AudioCapacity.of([[speed]], FPS)
    assert capacity.headroom(16) == pytest.approx(1 / 0.055 / FPS)
    old = AudioCapacity.of([[ReplicaSpeed(load.capacity_per_second, load.mean_batch)]], FPS)
    assert old.headroom(16) == pytest.approx(100 / 16 / FPS)
    assert capacity.admits(15) and not old.admits(15)
    assert speed.capacity_at(16) == pytest.approx(16 / 0.055)
    # Seeded by the probe but nothing served yet: known (the model), where the old rule knew nothing.
    seeded = stage_pb2.StageLoad(step_base_seconds=0.015, step_unit_seconds=0.0025, model_points=3)
    assert replica_speed(seeded) is not None and replica_speed(stage_pb2.StageLoad()) is None
    # Code2Wav: a row adds its window's frames, each frame 1 ms.
    windows = StepFit(0.0, 0.001, 25.0, points=2)
    assert windows.row_rate(4) == pytest.approx(25 / 0.1)


def test_a_model_below_the_measured_speed_is_floored_by_it_at_the_measured_batch_and_beyond():
    """The model says 4 streams get 14 frames/s each (a 70 ms step), the stage measures 240 frames/s
    at batch 4 now: a larger batch makes no fewer, so 4 or more streams share at least 240; below
    the measured batch the model stands (one stream is not assumed to get all 240)."""
    slow = StepFit(0.0, 0.0175, 1.0, points=3)
    speed = ReplicaSpeed(240.0, 4.0, slow)
    assert speed.stream_rate(4) == pytest.approx(60.0)
    assert speed.stream_rate(16) == pytest.approx(15.0)
    assert speed.stream_rate(2) == pytest.approx(slow.row_rate(2))
    fast = StepFit(0.015, 0.0025, 1.0, points=3)  # where the model says more, the model counts
    assert ReplicaSpeed(40.0, 4.0, fast).stream_rate(16) == pytest.approx(fast.row_rate(16))
    assert AudioCapacity.of([[speed]], FPS).headroom(8) == pytest.approx(30.0 / FPS)


def test_a_fragile_streams_need_holds_one_more_that_would_undo_its_plan():
    capacity = one(100.0)  # headroom 8 / n
    assert capacity.admits(1, need=4.0)  # 4.0 with two streams
    assert not capacity.admits(2, need=4.0)  # 2.7 with three
    assert not AudioCapacity().admits(1, need=1.0)  # unknown speed: wait for it to settle


def test_the_headroom_needed_is_the_smallest_without_a_predicted_stall():
    for plan in (ChunkPlan(2, 25), ChunkPlan(4, 25), ChunkPlan(16, 25, schedule="fixed")):
        need = headroom_needed(plan, FPS, jitter=DEFAULT_START_JITTER_S)
        assert predicted_stalls(need, plan, FPS, jitter=DEFAULT_START_JITTER_S) == 0
        assert predicted_stalls(need * 0.97, plan, FPS, jitter=DEFAULT_START_JITTER_S) > 0
    # A longer first chunk needs less: the initial size that sizing picks at a headroom meets it.
    assert headroom_needed(ChunkPlan(2, 25), FPS) > headroom_needed(ChunkPlan(8, 25), FPS)
    chosen = initial_frames_for(3.0, 25)
    assert headroom_needed(ChunkPlan(chosen, 25), FPS) <= 3.0
