"""Admission's limits from what the stages report (gateway/admission/limits.py): the room of the
replicas in rotation, and the caps an operator sets instead. Replicas with fake Infos; no stage runs."""

from __future__ import annotations

from gateway.admission.limits import QUEUE_FLOOR, UNREPORTED_ROOM, Limits, Room, room_of
from gateway.cluster.replica import Replica, ReplicaSet
from omnistream.proto.omni.v1 import stage_pb2
from tests.unit.gateway.infos import stage_info


def replica(stage: str, max_requests: int, in_rotation: bool = True) -> Replica:
    info = stage_info(stage, limits=stage_pb2.StageLimits(max_batch=16, max_requests=max_requests))
    return Replica(stage, "127.0.0.1:1", None, None, None, healthy=in_rotation, info=info, accepted=True)  # type: ignore[arg-type]


def sets(**stages: list[Replica]) -> dict[str, ReplicaSet]:
    return {stage: ReplicaSet(stage, stages.get(stage, [])) for stage in ("thinker", "talker", "code2wav")}


def test_the_room_is_the_replicas_in_rotation_summed_and_audio_the_tighter_audio_stage():
    room = room_of(
        sets(
            thinker=[
                replica("thinker", 64),
                replica("thinker", 64),
                replica("thinker", 64, in_rotation=False),
            ],
            talker=[replica("talker", 64), replica("talker", 32)],
            code2wav=[replica("code2wav", 64), replica("code2wav", 64)],
        )
    )
    assert room == Room(requests=128, audio=96)


def test_a_replica_that_reports_no_max_requests_counts_as_the_old_cap_and_no_replica_as_none():
    assert room_of(sets(thinker=[replica("thinker", 0)])) == Room(UNREPORTED_ROOM, 0)
    assert room_of(sets()) == Room(0, 0)


def test_by_default_the_limits_are_the_room_and_as_many_may_wait_at_least_the_floor():
    assert Limits.of(Room(64, 32)) == Limits(concurrency=64, queue=64, audio_hold=64, audio=32)
    assert Limits.of(Room(64, 128)).audio == 64  # an audio request needs a thinker too
    small = Limits.of(Room(4, 4))
    assert (small.concurrency, small.queue, small.audio_hold) == (4, QUEUE_FLOOR, QUEUE_FLOOR)
    # Nothing reported yet: no slot, but requests may wait for one (within queue_timeout).
    assert Limits.of(None) == Limits(concurrency=0, queue=QUEUE_FLOOR, audio_hold=QUEUE_FLOOR, audio=0)


def test_an_operators_caps_win_and_the_queues_then_follow_the_cap():
    capped = Limits.of(Room(64, 64), max_concurrency=8)
    assert capped == Limits(concurrency=8, queue=8, audio_hold=8, audio=None)
    assert capped.with_audio == 8
    assert Limits.of(Room(1, 0), max_concurrency=32).with_audio == 32  # whatever the stages say
    assert Limits.of(Room(64, 64), max_queue=0, max_audio_hold=3) == Limits(64, 0, 3, 64)
    assert Limits.of(Room(64, 64), max_concurrency=8, max_queue=2).queue == 2
