"""Chunk identity: `<request_id>_<stage>_<index>`, and strict in-order checking of chunk streams.

Every message between stages carries a key so that a lost, repeated or misrouted chunk is an error
at the first place it is seen rather than garbled audio three stages later.

Request ids are 1..128 characters from `[A-Za-z0-9.:-]`. Underscores are deliberately excluded: the
canonical string joins the parts with "_", so forbidding it in ids makes `parse()` unambiguous and
`parse(str(key)) == key` always hold.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from omnistream.request.errors import InvalidRequest, SequenceError
from omnistream.wire.protogen import ensure_generated

ensure_generated()

from omnistream.proto.omni.v1 import common_pb2  # noqa: E402  (generated just above)

if TYPE_CHECKING:
    from omnistream.proto.omni.v1.common_pb2 import ChunkKey as ChunkKeyProto

MAX_REQUEST_ID_LEN = 128
MAX_INDEX = 2**32 - 1  # the wire field is uint32
REQUEST_ID_RE = re.compile(rf"[A-Za-z0-9.:-]{{1,{MAX_REQUEST_ID_LEN}}}")
_INDEX_RE = re.compile(r"0|[1-9][0-9]*")  # canonical decimal only, so str(parse(s)) == s


class Stage(StrEnum):
    """Lowercase stage names as they appear in canonical keys, logs and metric labels."""

    THINKER = "thinker"
    TALKER = "talker"
    CODE2WAV = "code2wav"
    GATEWAY = "gateway"


_TO_PROTO = {
    Stage.THINKER: common_pb2.STAGE_THINKER,
    Stage.TALKER: common_pb2.STAGE_TALKER,
    Stage.CODE2WAV: common_pb2.STAGE_CODE2WAV,
    Stage.GATEWAY: common_pb2.STAGE_GATEWAY,
}
_FROM_PROTO = {v: k for k, v in _TO_PROTO.items()}


# How much of a refused request id its error quotes: the message becomes a gRPC status, whose
# trailers are refused past 8 KiB (a long id would turn INVALID_ARGUMENT into RESOURCE_EXHAUSTED).
QUOTED_ID_CHARS = 64


def validate_request_id(request_id: str) -> str:
    """Return `request_id` unchanged, or raise InvalidRequest explaining what is wrong with it."""
    if not isinstance(request_id, str) or not REQUEST_ID_RE.fullmatch(request_id):
        if not request_id:
            problem = "must not be empty"
        elif isinstance(request_id, str) and len(request_id) > MAX_REQUEST_ID_LEN:
            problem = f"is {len(request_id)} characters, more than {MAX_REQUEST_ID_LEN}"
        else:
            problem = "may only contain letters, digits, '.', ':' and '-' (no '_')"
        quoted = request_id
        if isinstance(request_id, str) and len(request_id) > QUOTED_ID_CHARS:
            quoted = f"{request_id[:QUOTED_ID_CHARS]}..."
        raise InvalidRequest(f"request_id {quoted!r} {problem}", field="request_id")
    return request_id


@dataclass(frozen=True, slots=True)
class ChunkKey:
    request_id: str
    stage: Stage
    index: int

    def __post_init__(self) -> None:
        validate_request_id(self.request_id)
        try:
            stage = Stage(self.stage)
        except ValueError:
            raise InvalidRequest(
                f"unknown stage {self.stage!r}; expected one of {[s.value for s in Stage]}", field="stage"
            ) from None
        object.__setattr__(self, "stage", stage)
        if (
            isinstance(self.index, bool)
            or not isinstance(self.index, int)
            or not 0 <= self.index <= MAX_INDEX
        ):
            raise InvalidRequest(
                f"chunk index {self.index!r} must be an integer in [0, {MAX_INDEX}]", field="index"
            )

    def __str__(self) -> str:
        return f"{self.request_id}_{self.stage.value}_{self.index}"

    def next(self) -> ChunkKey:
        """The key of the following message on the same stream."""
        return ChunkKey(self.request_id, self.stage, self.index + 1)

    @classmethod
    def parse(cls, text: str) -> ChunkKey:
        parts = text.split("_")
        if len(parts) != 3 or not _INDEX_RE.fullmatch(parts[2]):
            raise InvalidRequest(
                f"chunk key {text!r} is not of the form <request_id>_<stage>_<index>", field="key"
            )
        return cls(parts[0], parts[1], int(parts[2]))  # type: ignore[arg-type]  # coerced in __post_init__

    def to_proto(self) -> ChunkKeyProto:
        return common_pb2.ChunkKey(request_id=self.request_id, stage=_TO_PROTO[self.stage], index=self.index)

    @classmethod
    def from_proto(cls, msg: ChunkKeyProto) -> ChunkKey:
        stage = _FROM_PROTO.get(msg.stage)
        if stage is None:
            raise InvalidRequest(
                f"chunk key for request {msg.request_id!r} has unspecified or unknown stage {msg.stage}",
                field="key",
            )
        return cls(msg.request_id, stage, msg.index)


class SequenceChecker:
    """Accepts exactly `<request_id>_<stage>_<n>`, `_<n+1>`, ... and rejects anything else.

    One instance guards one direction of one stream. Rejections raise SequenceError (a gap, a
    duplicate or a chunk of another request or stage) naming both the received and the expected key.
    """

    __slots__ = ("_next", "request_id", "stage")

    def __init__(self, request_id: str, stage: Stage | str, first_index: int = 0) -> None:
        expected = ChunkKey(request_id, stage, first_index)  # type: ignore[arg-type]  # validates all three
        self.request_id = expected.request_id
        self.stage = expected.stage
        self._next = first_index

    @property
    def expected(self) -> ChunkKey:
        """The key the next message must carry."""
        return ChunkKey(self.request_id, self.stage, self._next)

    def expect(self, key: ChunkKey | ChunkKeyProto) -> ChunkKey:
        """Check `key` against the expected one and advance; returns the key as a ChunkKey."""
        got: ChunkKey = key if isinstance(key, ChunkKey) else ChunkKey.from_proto(key)
        expected = self.expected
        if got.request_id != self.request_id:
            problem = f"belongs to request {got.request_id!r}, this stream is {self.request_id!r}"
        elif got.stage != self.stage:
            problem = f"comes from stage {got.stage.value}, this stream carries {self.stage.value}"
        elif got.index > self._next:
            problem = f"skips {got.index - self._next} chunk(s)"
        elif got.index < self._next:
            problem = "is a duplicate or replay"
        else:
            self._next += 1
            return got
        raise SequenceError(f"chunk key {got} {problem} (expected {expected})", field="key")
