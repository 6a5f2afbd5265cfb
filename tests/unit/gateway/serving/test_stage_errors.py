"""How the gateway reads a failed call to a stage (gateway/serving/stage_errors.py): a status the
stage sent stays what it is, a status gRPC made up because the link broke is the stage being
unavailable. The errors are real `grpc.aio.AioRpcError`s as grpc aio raises them (code, details,
trailing metadata)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.serving.stage_errors import grpc_error, stage_error
from omnistream.request.errors import InternalError, OmniError, status_of
from omnistream.service.server import (
    ERROR_KIND_METADATA_KEY,
    STAGE_ORIGIN,
    STATUS_ORIGIN_METADATA_KEY,
)

CORE_INTERNAL = "Internal error from Core"
STAGE_MARK = ((ERROR_KIND_METADATA_KEY, "internal"), (STATUS_ORIGIN_METADATA_KEY, STAGE_ORIGIN))


def rpc_error(code: grpc.StatusCode, details: str, trailing=()) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details, None)


def test_an_unmarked_internal_from_core_is_the_stage_unavailable():
    error = grpc_error(rpc_error(grpc.StatusCode.INTERNAL, CORE_INTERNAL), "talker")
    assert error.kind == "unavailable"
    assert error.stage == "talker"
    assert error.message.startswith("talker: ")
    assert CORE_INTERNAL in error.message  # what gRPC said stays readable in the message
    assert status_of(error).grpc_code == grpc.StatusCode.UNAVAILABLE
    assert status_of(error).http_status == 503


def test_a_stage_marked_internal_stays_internal():
    sent = rpc_error(grpc.StatusCode.INTERNAL, "internal error (KeyError)", STAGE_MARK)
    error = grpc_error(sent, "thinker")
    assert error.kind == "internal"
    assert isinstance(error, InternalError)
    assert error.stage == "thinker"
    assert error.message == "thinker: internal error (KeyError)"
    assert status_of(error).grpc_code == grpc.StatusCode.INTERNAL


def test_a_stage_from_before_the_marker_is_trusted_by_its_error_kind():
    legacy = ((ERROR_KIND_METADATA_KEY, "internal"),)
    assert grpc_error(rpc_error(grpc.StatusCode.INTERNAL, "boom", legacy), "code2wav").kind == "internal"


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (grpc.StatusCode.UNAVAILABLE, "keepalive watchdog timeout"),
        (grpc.StatusCode.UNAVAILABLE, "Connection reset by peer"),
        (grpc.StatusCode.UNKNOWN, "Stream removed"),
        (grpc.StatusCode.CANCELLED, "Received RST_STREAM with error code 8"),
        (grpc.StatusCode.INTERNAL, "Received RST_STREAM with error code 2"),
    ],
)
def test_every_unmarked_link_failure_is_unavailable_naming_the_stage(code, details):
    error = stage_error("code2wav", code, details, ())
    assert (error.kind, error.stage) == ("unavailable", "code2wav")
    assert error.message.startswith("code2wav: ") and details in error.message


def test_a_stage_marked_unavailable_and_sequence_error_keep_their_kinds():
    draining = ((ERROR_KIND_METADATA_KEY, "unavailable"), (STATUS_ORIGIN_METADATA_KEY, STAGE_ORIGIN))
    assert stage_error("talker", grpc.StatusCode.UNAVAILABLE, "talker is draining", draining).kind == (
        "unavailable"
    )
    sequence = ((ERROR_KIND_METADATA_KEY, "sequence_error"), (STATUS_ORIGIN_METADATA_KEY, STAGE_ORIGIN))
    error = stage_error("talker", grpc.StatusCode.INVALID_ARGUMENT, "chunk 3 twice", sequence)
    assert error.kind == "sequence_error" and status_of(error).http_status == 422


def test_an_unmarked_local_deadline_keeps_its_meaning():
    """This side's own deadline is no link failure: 504, not 503."""
    error = stage_error("thinker", grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
    assert error.kind == "deadline_exceeded"


class _EndedCall:
    """A stream call that has ended with `code` (what grpc aio's call answers once it is done)."""

    def __init__(self, code: grpc.StatusCode, details: str = "", done: bool = True) -> None:
        self._code, self._details, self._done = code, details, done

    def done(self) -> bool:
        return self._done

    async def code(self) -> grpc.StatusCode:
        return self._code

    async def details(self) -> str:
        return self._details

    async def trailing_metadata(self) -> grpc.aio.Metadata:
        return grpc.aio.Metadata()


async def _write_to(call, moot_once_ok: bool = True) -> None:
    """A write to `call` that grpc refuses because the call already finished."""
    from gateway.serving.stage_errors import calls_to as _calls_to

    async with _calls_to("code2wav", call, moot_once_ok):
        raise asyncio.InvalidStateError("RPC already finished.")


async def test_a_write_to_a_call_a_cut_link_ended_is_that_stage_unavailable():
    """A link cut mid-stream can end the call just before another stage's pump writes to it: the
    write's bare "RPC already finished" becomes the call's own status, the stage unavailable."""
    with pytest.raises(OmniError) as caught:
        await _write_to(
            _EndedCall(grpc.StatusCode.UNAVAILABLE, "Stream removed (recvmsg: Connection timed out)")
        )
    assert (caught.value.kind, caught.value.stage) == ("unavailable", "code2wav")
    assert status_of(caught.value).http_status == 503


async def test_a_write_to_a_call_that_ended_by_itself_is_moot_unless_the_caller_owns_that_call():
    await _write_to(_EndedCall(grpc.StatusCode.OK))  # nothing raised: what it carried is moot
    with pytest.raises(asyncio.InvalidStateError):
        await _write_to(_EndedCall(grpc.StatusCode.OK), moot_once_ok=False)
    with pytest.raises(asyncio.InvalidStateError):  # not ended: not a call's status to read
        await _write_to(_EndedCall(grpc.StatusCode.UNAVAILABLE, done=False))
