"""The chunk plan on the stage wire (`omnistream.wire.convert`): both opens carry it whole, schedule
included, and an open from an older gateway (no schedule field) still means what it meant: fixed."""

from __future__ import annotations

import pytest

from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest
from omnistream.request.stage_chain import stage_opens
from omnistream.wire.convert import (
    code2wav_open_proto,
    plan_from_fields,
    schedule_from_proto,
    talker_open_proto,
)

REQUEST = GenerationRequest(messages=[{"role": "user", "content": "hi"}])


def _read(open_) -> ChunkPlan:
    """What a stage makes of an open (as `StageServicer._open_streaming` does), after the wire."""
    parsed = type(open_).FromString(open_.SerializeToString())
    return plan_from_fields(
        parsed.initial_chunk_frames, parsed.chunk_frames, parsed.left_context_frames, parsed.chunk_schedule
    )


@pytest.mark.parametrize(
    "plan",
    [
        ChunkPlan(2, 25, 25, "grow"),
        ChunkPlan(2, 25, 25, "fixed"),
        ChunkPlan(16, 25, 10, "grow"),
        ChunkPlan(1, 8, 72, "fixed"),
    ],
)
def test_both_opens_carry_the_plan_whole(plan: ChunkPlan) -> None:
    opens = stage_opens(REQUEST, plan)
    talker, code2wav = talker_open_proto("r", opens), code2wav_open_proto("r", opens)
    assert _read(talker) == plan and _read(code2wav) == plan
    assert talker.chunk_schedule == code2wav.chunk_schedule != stage_pb2.CHUNK_SCHEDULE_UNSPECIFIED


def test_the_schedules_wire_values() -> None:
    opens = stage_opens(REQUEST, ChunkPlan(2, 25, 25, "grow"))
    assert talker_open_proto("r", opens).chunk_schedule == stage_pb2.CHUNK_SCHEDULE_GROWING
    opens = stage_opens(REQUEST, ChunkPlan(2, 25, 25, "fixed"))
    assert code2wav_open_proto("r", opens).chunk_schedule == stage_pb2.CHUNK_SCHEDULE_FIXED


def test_an_older_gateways_open_means_fixed() -> None:
    """Such a gateway never sets the field; its talker and code2wav windows were the fixed ones."""
    talker = stage_pb2.TalkerOpen(
        request_id="r", initial_chunk_frames=2, chunk_frames=25, left_context_frames=25
    )
    code2wav = stage_pb2.Code2WavOpen(request_id="r", initial_chunk_frames=2, chunk_frames=25)
    assert _read(talker) == ChunkPlan(2, 25, 25, "fixed")
    assert _read(code2wav) == ChunkPlan(2, 25, 25, "fixed")
    assert plan_from_fields(0, 0, 0) == ChunkPlan(schedule="fixed")  # every field at its default


def test_an_unknown_schedule_number_is_invalid_naming_the_field() -> None:
    with pytest.raises(InvalidRequest) as info:
        plan_from_fields(2, 25, 25, 9)
    assert info.value.field == "chunk_schedule"
    with pytest.raises(InvalidRequest) as info:
        schedule_from_proto(9, None, field="codec_chunk_schedule")
    assert info.value.field == "codec_chunk_schedule"
    assert schedule_from_proto(stage_pb2.CHUNK_SCHEDULE_UNSPECIFIED, None) is None
