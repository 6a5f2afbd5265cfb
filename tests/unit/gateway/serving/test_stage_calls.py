"""`run_stages` (gateway/serving/stage_calls.py, over the links of stage_links.py) against real
loopback gRPC servers: how a failed call reads, and in which order a request opens the stages."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.serving.stage_calls import StageStubs, run_stages
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.request.errors import InternalError, InvalidRequest, OmniError
from omnistream.request.generation import DoneEvent, GenerationRequest, TextEvent
from omnistream.service.server import (
    OPEN_ACCEPTED_METADATA,
    abort_with,
)

CORE_INTERNAL = "Internal error from Core"  # what grpc aio reports for a transport broken under a call


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
