from __future__ import annotations

import pytest

from omnistream.proto.omni.v1 import common_pb2
from omnistream.request.errors import InvalidRequest, SequenceError
from omnistream.wire.chunk_key import ChunkKey, SequenceChecker, Stage, validate_request_id


def test_canonical_string_form() -> None:
    assert str(ChunkKey("req-42", Stage.TALKER, 3)) == "req-42_talker_3"
    assert str(ChunkKey("a.b:c", "code2wav", 0)) == "a.b:c_code2wav_0"  # type: ignore[arg-type]


@pytest.mark.parametrize("stage", list(Stage))
def test_parse_round_trips(stage: Stage) -> None:
    key = ChunkKey("Req-1.2:x", stage, 17)
    assert ChunkKey.parse(str(key)) == key
    assert str(ChunkKey.parse(str(key))) == str(key)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "abc",
        "abc_thinker",
        "a_b_thinker_1",  # underscore in the id would make the split ambiguous
        "abc_thinker_01",  # non-canonical index
        "abc_thinker_-1",
        "abc_thinker_+1",
        "abc_thinker_ 1",
        "abc_Thinker_1",
        "abc_unspecified_1",
        "_thinker_1",
        "abc_thinker_4294967296",
    ],
)
def test_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(InvalidRequest):
        ChunkKey.parse(text)


@pytest.mark.parametrize(
    ("request_id", "needle"),
    [
        ("", "must not be empty"),
        ("a" * 129, "129 characters"),
        ("has_underscore", "no '_'"),
        ("spa ce", "may only contain"),
        ("ünï", "may only contain"),
        ("new\nline", "may only contain"),
    ],
)
def test_request_id_rules(request_id: str, needle: str) -> None:
    with pytest.raises(InvalidRequest, match=needle) as info:
        validate_request_id(request_id)
    assert info.value.field == "request_id"
    with pytest.raises(InvalidRequest):
        ChunkKey(request_id, Stage.THINKER, 0)


def test_a_long_refused_request_id_is_quoted_in_part() -> None:
    """The message becomes a gRPC status: it stays small whatever the client sent."""
    with pytest.raises(InvalidRequest, match="10000 characters") as info:
        validate_request_id("a" * 10_000)
    assert len(info.value.message) < 200


def test_request_id_limits_accepted() -> None:
    assert validate_request_id("a" * 128) == "a" * 128
    assert validate_request_id("0") == "0"


def test_key_validation() -> None:
    with pytest.raises(InvalidRequest, match="index"):
        ChunkKey("r", Stage.THINKER, -1)
    with pytest.raises(InvalidRequest, match="index"):
        ChunkKey("r", Stage.THINKER, 2**32)
    with pytest.raises(InvalidRequest, match="unknown stage"):
        ChunkKey("r", "vocoder", 0)  # type: ignore[arg-type]
    key = ChunkKey("r", "thinker", 0)  # type: ignore[arg-type]
    assert key.stage is Stage.THINKER
    with pytest.raises(AttributeError):
        key.index = 1  # type: ignore[misc]


def test_proto_round_trip_and_stage_mapping() -> None:
    expected = {
        Stage.THINKER: common_pb2.STAGE_THINKER,
        Stage.TALKER: common_pb2.STAGE_TALKER,
        Stage.CODE2WAV: common_pb2.STAGE_CODE2WAV,
        Stage.GATEWAY: common_pb2.STAGE_GATEWAY,
    }
    for stage, wire in expected.items():
        key = ChunkKey("r-1", stage, 9)
        msg = key.to_proto()
        assert (msg.request_id, msg.stage, msg.index) == ("r-1", wire, 9)
        assert ChunkKey.from_proto(msg) == key
        # the wire form survives serialization
        assert ChunkKey.from_proto(common_pb2.ChunkKey.FromString(msg.SerializeToString())) == key


def test_from_proto_rejects_unspecified_stage_and_empty_key() -> None:
    with pytest.raises(InvalidRequest, match="unspecified or unknown stage"):
        ChunkKey.from_proto(common_pb2.ChunkKey(request_id="r", index=0))
    with pytest.raises(InvalidRequest, match="must not be empty"):
        ChunkKey.from_proto(common_pb2.ChunkKey(stage=common_pb2.STAGE_THINKER))


def test_next() -> None:
    assert ChunkKey("r", Stage.TALKER, 4).next() == ChunkKey("r", Stage.TALKER, 5)


def test_sequence_checker_accepts_in_order_keys_and_protos() -> None:
    checker = SequenceChecker("r", Stage.THINKER)
    assert checker.expected == ChunkKey("r", Stage.THINKER, 0)
    assert checker.expect(ChunkKey("r", Stage.THINKER, 0)) == ChunkKey("r", Stage.THINKER, 0)
    assert checker.expect(ChunkKey("r", Stage.THINKER, 1).to_proto()) == ChunkKey("r", Stage.THINKER, 1)
    assert checker.expected.index == 2


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        (ChunkKey("r", Stage.THINKER, 3), r"r_thinker_3 skips 1 chunk\(s\) \(expected r_thinker_2\)"),
        (ChunkKey("r", Stage.THINKER, 1), r"r_thinker_1 is a duplicate or replay \(expected r_thinker_2\)"),
        (ChunkKey("r", Stage.THINKER, 0), "duplicate"),
        (ChunkKey("other", Stage.THINKER, 2), r"other_thinker_2 belongs to request 'other'"),
        (ChunkKey("r", Stage.TALKER, 2), r"r_talker_2 comes from stage talker"),
    ],
)
def test_sequence_checker_rejections_name_the_key(key: ChunkKey, needle: str) -> None:
    checker = SequenceChecker("r", Stage.THINKER)
    checker.expect(ChunkKey("r", Stage.THINKER, 0))
    checker.expect(ChunkKey("r", Stage.THINKER, 1))
    with pytest.raises(SequenceError, match=needle) as info:
        checker.expect(key)
    assert info.value.field == "key"
    # a rejected key does not advance the stream
    assert checker.expect(ChunkKey("r", Stage.THINKER, 2)).index == 2


def test_sequence_error_is_an_invalid_request() -> None:
    # Servicers map both to INVALID_ARGUMENT; catching InvalidRequest must also catch SequenceError.
    checker = SequenceChecker("r", Stage.GATEWAY, first_index=5)
    with pytest.raises(InvalidRequest):
        checker.expect(ChunkKey("r", Stage.GATEWAY, 4))


def test_sequence_checker_validates_its_own_arguments() -> None:
    with pytest.raises(InvalidRequest):
        SequenceChecker("bad_id", Stage.THINKER)
    with pytest.raises(InvalidRequest):
        SequenceChecker("r", "nope")
