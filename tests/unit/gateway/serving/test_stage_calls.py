"""How the gateway reads a failed call to a stage (gateway/serving/stage_calls.py): a status the
stage sent stays what it is, a status gRPC made up because the link broke is the stage being unavailable.

The errors are real `grpc.aio.AioRpcError`s as grpc aio raises them (code, details, trailing
metadata); the last tests run `run_stages` against real loopback gRPC servers: how a failed call
reads, and in which order a request opens the stages."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.serving.stage_calls import StageStubs, grpc_error, run_stages, stage_error
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.request.errors import InternalError, InvalidRequest, OmniError, status_of
from omnistream.request.generation import DoneEvent, GenerationRequest, TextEvent
from omnistream.service.server import (
    ERROR_KIND_METADATA_KEY,
    OPEN_ACCEPTED_METADATA,
    STAGE_ORIGIN,
    STATUS_ORIGIN_METADATA_KEY,
    abort_with,
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


class _Thinker(stage_pb2_grpc.ThinkerServiceServicer):
    """A thinker that fails every stream: through `abort_with` (marked, as the real stages do), or
    with the unmarked INTERNAL that grpc aio reports for a transport broken under a call."""

    def __init__(self, marked: bool) -> None:
        self.marked = marked

    async def Stream(self, request_iterator, context):
        await anext(request_iterator)
        if self.marked:
            await abort_with(context, InternalError("the engine failed"))
        await context.abort(grpc.StatusCode.INTERNAL, CORE_INTERNAL)


async def _run_against(marked: bool) -> OmniError:
    server = grpc.aio.server()
    stage_pb2_grpc.add_ThinkerServiceServicer_to_server(_Thinker(marked), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        stubs = StageStubs.connect(address, address, address)
        request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], return_audio=False)

        async def emit(_event) -> None:
            pass

        with pytest.raises(OmniError) as caught:
            await run_stages(stubs, request, "r1", request.chunk_plan(2), emit, timeout=30)
        return caught.value
    finally:
        await server.stop(None)


async def test_run_stages_reports_an_unmarked_internal_as_the_thinker_unavailable():
    error = await _run_against(marked=False)
    assert (error.kind, error.stage) == ("unavailable", "thinker")


async def test_run_stages_keeps_the_stage_marked_internal():
    error = await _run_against(marked=True)
    assert (error.kind, error.stage, error.message) == ("internal", "thinker", "thinker: the engine failed")


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
    from gateway.serving.stage_calls import _calls_to

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


class _Opened:
    """Three stages on one loopback server that see in which order a request opens them: the
    thinker notes its open and sends one finished chunk; the talker accepts only once the thinker
    has sent it (`refuse`: it refuses then instead); code2wav accepts at once. A gateway that
    waited for the talker before opening the thinker would never see the talker accept. `mark`: the
    initial metadata that says a stage accepted (() as a stage from before the mark sends)."""

    def __init__(self, refuse: bool = False, mark: tuple = OPEN_ACCEPTED_METADATA) -> None:
        self.refuse = refuse
        mark_of_acceptance = mark
        self.chunk_sent = asyncio.Event()
        self.talker_inputs: list[stage_pb2.TalkerRequest] = []
        stages = self

        class Thinker(stage_pb2_grpc.ThinkerServiceServicer):
            async def Stream(self, request_iterator, context):
                await anext(request_iterator)
                await context.send_initial_metadata(mark_of_acceptance)
                yield stage_pb2.ThinkerChunk(token_ids=[7], text_delta="hi", finished=True)
                stages.chunk_sent.set()

        class Talker(stage_pb2_grpc.TalkerServiceServicer):
            async def Stream(self, request_iterator, context):
                await anext(request_iterator)
                await asyncio.wait_for(stages.chunk_sent.wait(), 10)
                if stages.refuse:
                    await abort_with(context, InvalidRequest("the talker refuses this request"))
                await context.send_initial_metadata(mark_of_acceptance)
                async for message in request_iterator:
                    stages.talker_inputs.append(message)
                return
                yield  # an async generator: a stream that ends without a chunk

        class Code2Wav(stage_pb2_grpc.Code2WavServiceServicer):
            async def Stream(self, request_iterator, context):
                await anext(request_iterator)
                await context.send_initial_metadata(mark_of_acceptance)
                async for _ in request_iterator:
                    pass
                return
                yield

        self.servicers = (Thinker(), Talker(), Code2Wav())

    async def run(self) -> tuple[list, object]:
        """`run_stages` of one spoken request against them: (what it emitted, what it returned or raised)."""
        server = grpc.aio.server()
        thinker, talker, code2wav = self.servicers
        stage_pb2_grpc.add_ThinkerServiceServicer_to_server(thinker, server)
        stage_pb2_grpc.add_TalkerServiceServicer_to_server(talker, server)
        stage_pb2_grpc.add_Code2WavServiceServicer_to_server(code2wav, server)
        address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        emitted: list = []

        async def emit(event) -> None:
            emitted.append(event)

        try:
            stubs = StageStubs.connect(address, address, address)
            request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], return_audio=True)
            try:
                async with asyncio.timeout(30):
                    outcome = await run_stages(stubs, request, "r1", request.chunk_plan(2), emit, timeout=30)
            except OmniError as exc:
                outcome = exc
            return emitted, outcome
        finally:
            await server.stop(None)


async def test_the_thinker_opens_while_the_audio_stages_accept_and_its_output_waits_for_them():
    stages = _Opened()
    emitted, done = await stages.run()
    assert isinstance(done, DoneEvent) and done.output_ids == [7] and done.finish_reason == "stop"
    assert [type(e) for e in emitted] == [TextEvent] and emitted[0].delta == "hi"
    # The thinker's chunk reached the talker only after it had accepted.
    assert [m.input.token_ids[:] for m in stages.talker_inputs] == [[7]]


async def test_an_audio_stage_that_refuses_fails_the_request_before_any_event_reaches_the_client():
    emitted, error = await _Opened(refuse=True).run()
    assert isinstance(error, OmniError) and (error.kind, error.stage) == ("invalid_request", "talker")
    assert "refuses" in error.message and emitted == []


async def test_a_stage_from_before_the_acceptance_mark_is_accepted_without_it():
    stages = _Opened(mark=())
    emitted, done = await stages.run()
    assert isinstance(done, DoneEvent) and [type(e) for e in emitted] == [TextEvent]
    assert [m.input.token_ids[:] for m in stages.talker_inputs] == [[7]]
