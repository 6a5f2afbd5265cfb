"""The gateway's gRPC API against a fake core: a real grpc.aio server and client, no model, no stages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
import numpy as np
import pytest

from gateway.admission.permits import Rejected
from gateway.api.grpc import RETRY_AFTER_METADATA_KEY, SERVICE_NAME, add_gateway_api
from gateway.cluster.deployment import Deployment
from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from omnistream.engine.sampling import SamplingParams
from omnistream.pipeline import AudioEvent, DoneEvent, GenerationRequest, TextEvent
from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, stage_pb2
from omnistream.request.defaults import DEFAULTS
from omnistream.request.errors import InvalidRequest, Unavailable
from omnistream.service.server import (
    ERROR_KIND_METADATA_KEY,
    GATEWAY_ORIGIN,
    STATUS_ORIGIN_METADATA_KEY,
    add_health_and_reflection,
    build_server,
)
from omnistream.wire.tensors import numpy_from_proto
from tests.unit.gateway.infos import VOICES, deployment

HANG = object()  # in a script: block until cancelled


class FakeSession:
    """Session-like: plays a script of events (an exception in it is raised there)."""

    def __init__(self, request_id: str, script: list) -> None:
        self.request_id = request_id
        self.script = script
        self.closed = asyncio.Event()
        self.events_finalized = asyncio.Event()
        self.reached_hang = asyncio.Event()

    async def events(self) -> AsyncIterator:
        # Unlike the real Session this does not call aclose() itself, so the tests see that the
        # servicer does.
        try:
            for item in self.script:
                if item is HANG:
                    self.reached_hang.set()
                    await asyncio.Event().wait()
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield item
        finally:
            self.events_finalized.set()

    async def aclose(self) -> None:
        self.closed.set()


class FakeCore:
    def __init__(self, script: list | None = None, open_error: BaseException | None = None) -> None:
        self.config = GatewayConfig()
        self.deployment = deployment()
        self.script = script or []
        self.open_error = open_error
        self.opened: list[tuple[GenerationRequest, str | None, float | None]] = []
        self.sessions: list[FakeSession] = []

    async def open(
        self,
        request: GenerationRequest,
        request_id: str | None = None,
        timeout: float | None = None,
        trace: object = None,
    ) -> FakeSession:
        self.opened.append((request, request_id, timeout))
        GatewayCore.validate(self, request)  # type: ignore[arg-type]  # the real checks, config only
        if self.open_error is not None:
            raise self.open_error
        session = FakeSession(request_id or "made-by-gateway", self.script)
        self.sessions.append(session)
        return session


Serve = Callable[[FakeCore], Awaitable[gateway_pb2_grpc.GatewayStub]]


@pytest.fixture
async def serve() -> AsyncIterator[Serve]:
    started: list[tuple[grpc.aio.Server, grpc.aio.Channel]] = []

    async def start(core: FakeCore) -> gateway_pb2_grpc.GatewayStub:
        server = build_server(16 * 1024 * 1024, 8)
        name = add_gateway_api(server, core)  # type: ignore[arg-type]
        add_health_and_reflection(server, [name])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        started.append((server, channel))
        return gateway_pb2_grpc.GatewayStub(channel)

    yield start
    for server, channel in started:
        await channel.close()
        await server.stop(None)


def chat(**fields) -> gateway_pb2.GenerateRequest:
    return gateway_pb2.GenerateRequest(messages=[common_pb2.Message(role="user", content="hi")], **fields)


async def collect(call) -> tuple[list[gateway_pb2.GenerateEvent], grpc.aio.AioRpcError | None]:
    events = []
    try:
        async for event in call:
            events.append(event)
    except grpc.aio.AioRpcError as exc:
        return events, exc
    return events, None


def metadata(error: grpc.aio.AioRpcError) -> dict[str, str]:
    return {key: value for key, value in error.trailing_metadata() or ()}


def pcm(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    audio = rng.uniform(-1, 1, n).astype(np.float32)
    audio[:4] = [-0.0, np.float32(1e-45), np.nextafter(np.float32(1), np.float32(0)), -1.0]  # edge bits
    return audio


def test_service_name() -> None:
    assert SERVICE_NAME == "omni.v1.Gateway"


async def test_events_arrive_in_order_with_keys_and_exact_audio(serve: Serve) -> None:
    first, second = pcm(960, 1), pcm(1920, 2)
    done = DoneEvent(
        [1, 2, 3], [7, 8, 9], "stop", frames=3, audio_samples=2880, ttft=0.01, ttfp=None, e2e=0.5
    )
    core = FakeCore(
        [
            TextEvent([7, 8], "Hel"),
            TextEvent([], ""),  # nothing new: not sent
            AudioEvent(first, 0, 24000),
            TextEvent([9], "lo"),
            AudioEvent(np.zeros(0, np.float32), 960, 24000),  # empty: not sent
            AudioEvent(second, 960, 24000),
            done,
        ]
    )
    stub = await serve(core)
    events, error = await collect(stub.Generate(chat(request_id="req-1")))
    assert error is None
    assert [e.WhichOneof("event") for e in events] == ["text", "audio", "text", "audio", "usage", "end"]
    assert [e.key.index for e in events] == list(range(6))
    assert {(e.key.request_id, e.key.stage) for e in events} == {("req-1", common_pb2.STAGE_GATEWAY)}
    assert (events[0].text.text, list(events[0].text.token_ids)) == ("Hel", [7, 8])
    assert (events[2].text.text, list(events[2].text.token_ids)) == ("lo", [9])
    for event, sent, first_sample in ((events[1], first, 0), (events[3], second, 960)):
        got = numpy_from_proto(event.audio.pcm, expect_dtype="float32")
        assert got.shape == sent.shape
        assert got.tobytes() == sent.tobytes()  # bit for bit, -0.0 and subnormals included
        assert (event.audio.sample_rate, event.audio.first_sample) == (24_000, first_sample)
    usage = events[4].usage
    assert (usage.prompt_tokens, usage.completion_tokens, usage.audio_frames, usage.audio_samples) == (
        3,
        3,
        3,
        2880,
    )
    assert usage.HasField("ttft_seconds") and usage.ttft_seconds == pytest.approx(0.01)
    assert not usage.HasField("ttfp_seconds")
    assert usage.e2e_seconds == pytest.approx(0.5)
    assert events[5].end.finish_reason == "stop"
    assert core.sessions[0].closed.is_set()


async def test_defaults_come_from_the_config(serve: Serve) -> None:
    core = FakeCore([DoneEvent([1], [2], "stop", 0, 0, None, None, 0.1)])
    stub = await serve(core)
    events, error = await collect(stub.Generate(chat()))
    assert error is None
    request, request_id, timeout = core.opened[0]
    assert request_id is None and timeout is None
    assert {e.key.request_id for e in events} == {"made-by-gateway"}
    config = core.config
    assert request.messages == [{"role": "user", "content": "hi"}] and request.prompt_ids is None
    assert request.max_tokens == config.default_max_tokens
    assert request.max_audio_frames == config.max_audio_frames
    assert request.return_audio and request.speaker == "ethan"
    assert request.initial_codec_chunk_frames is None
    assert request.mode == "async"
    assert (request.codec_chunk_frames, request.codec_left_context_frames) == (
        config.codec_chunk_frames,
        config.codec_left_context_frames,
    )
    # Unset sampling messages take the one table's defaults (sampled, not greedy).
    assert request.sampling == SamplingParams(DEFAULTS.temperature, DEFAULTS.top_p, DEFAULTS.top_k)
    assert request.talker_sampling == SamplingParams(
        DEFAULTS.talker_temperature,
        DEFAULTS.talker_top_p,
        DEFAULTS.talker_top_k,
        DEFAULTS.talker_repetition_penalty,
    )
    assert not request.sampling.greedy and not request.talker_sampling.greedy


async def test_explicit_fields_are_mapped(serve: Serve) -> None:
    core = FakeCore([DoneEvent([1], [2], "length", 0, 0, None, None, 0.1)])
    core.config.async_chunk = False
    stub = await serve(core)
    request = gateway_pb2.GenerateRequest(
        prompt_ids=[5, 6],
        max_tokens=7,
        sampling=common_pb2.Sampling(temperature=0.5, top_p=0.875, seed=3),
        text_only=True,
        speaker="Chelsie",
        max_audio_frames=100,
        talker_sampling=common_pb2.Sampling(temperature=0.75, top_k=5, repetition_penalty=1.125),
        initial_codec_chunk_frames=3,
        codec_chunk_schedule=stage_pb2.CHUNK_SCHEDULE_FIXED,
        ignore_eos=True,
        timeout_seconds=12.5,
    )
    events, error = await collect(stub.Generate(request))
    assert error is None and events[-1].end.finish_reason == "length"
    got, _, timeout = core.opened[0]
    assert got.prompt_ids == [5, 6] and got.messages is None
    assert (got.max_tokens, got.max_audio_frames, got.initial_codec_chunk_frames) == (7, 100, 3)
    assert not got.return_audio and got.speaker == "Chelsie" and got.ignore_eos
    assert got.mode == "sequential"  # unset async_chunk follows the config
    assert got.codec_chunk_schedule == "fixed"
    assert got.sampling == SamplingParams(temperature=0.5, top_p=0.875, seed=3)  # float32-exact
    # A set talker_sampling is taken as given; without a seed of its own it takes the request's.
    assert got.talker_sampling == SamplingParams(0.75, 1.0, 5, 1.125, 3)
    assert timeout == 12.5

    await collect(stub.Generate(chat(async_chunk=True, timeout_seconds=100), timeout=5))
    got, _, timeout = core.opened[1]
    assert got.mode == "async"
    assert got.codec_chunk_schedule == "grow"  # UNSPECIFIED: the table's default
    assert 0 < timeout < 6  # the RPC deadline (5 s, give or take clock skew) caps timeout_seconds


async def test_rejected_is_resource_exhausted_with_retry_after(serve: Serve) -> None:
    core = FakeCore(open_error=Rejected("server is at its limit", reason="concurrency", retry_after=3))
    stub = await serve(core)
    events, error = await collect(stub.Generate(chat()))
    assert events == [] and error is not None
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limit" in error.details()
    md = metadata(error)
    assert md[RETRY_AFTER_METADATA_KEY] == "3"
    assert md[ERROR_KIND_METADATA_KEY] == "overloaded"
    assert md[STATUS_ORIGIN_METADATA_KEY] == GATEWAY_ORIGIN  # the gateway's own, never a stage's


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (gateway_pb2.GenerateRequest(), "messages"),
        (chat(prompt_ids=[1]), "messages"),
        (gateway_pb2.GenerateRequest(messages=[common_pb2.Message(role="robot", content="x")]), "role"),
        (chat(sampling=common_pb2.Sampling(temperature=-1)), "temperature"),
        (chat(talker_sampling=common_pb2.Sampling(top_p=2)), "talker_top_p"),
        (chat(timeout_seconds=-1), "timeout_seconds"),
        (chat(max_tokens=1_000_000), "max_tokens"),  # checked by the real GatewayCore.validate
        (chat(max_audio_frames=1_000_000), "max_audio_frames"),
        (chat(speaker="nobody"), "voice"),
        (chat(codec_chunk_schedule=7), "codec_chunk_schedule"),  # a number this gateway does not know
    ],
)
async def test_invalid_request_is_invalid_argument_naming_the_field(
    serve: Serve, request_: gateway_pb2.GenerateRequest, field: str
) -> None:
    stub = await serve(FakeCore())
    events, error = await collect(stub.Generate(request_))
    assert events == [] and error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in error.details()
    assert metadata(error)[ERROR_KIND_METADATA_KEY] == "invalid_request"


async def test_core_error_without_the_field_in_its_message_gets_it_prefixed(serve: Serve) -> None:
    stub = await serve(
        FakeCore(open_error=InvalidRequest("out of range", field="initial_codec_chunk_frames"))
    )
    _, error = await collect(stub.Generate(chat()))
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == "initial_codec_chunk_frames: out of range"


async def test_mid_stream_error_sends_an_error_event_then_the_status(serve: Serve) -> None:
    core = FakeCore([TextEvent([1], "a"), Unavailable("thinker replica went away")])
    stub = await serve(core)
    events, error = await collect(stub.Generate(chat(request_id="r2")))
    assert [e.WhichOneof("event") for e in events] == ["text", "error"]
    assert [e.key.index for e in events] == [0, 1] and events[1].key.request_id == "r2"
    assert (events[1].error.kind, events[1].error.message) == ("unavailable", "thinker replica went away")
    assert error is not None and error.code() == grpc.StatusCode.UNAVAILABLE
    assert metadata(error)[ERROR_KIND_METADATA_KEY] == "unavailable"
    assert metadata(error)[STATUS_ORIGIN_METADATA_KEY] == GATEWAY_ORIGIN
    assert core.sessions[0].closed.is_set()


async def test_unexpected_mid_stream_error_does_not_leak_internals(serve: Serve) -> None:
    core = FakeCore([RuntimeError("secret detail")])
    stub = await serve(core)
    events, error = await collect(stub.Generate(chat()))
    assert [e.error.kind for e in events] == ["internal"]
    assert error is not None and error.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in error.details() and "secret" not in events[0].error.message


async def test_client_cancel_closes_the_session(serve: Serve) -> None:
    core = FakeCore([TextEvent([1], "a"), HANG])
    stub = await serve(core)
    call = stub.Generate(chat())
    first = await call.read()
    assert first.text.text == "a"
    session = core.sessions[0]
    await asyncio.wait_for(session.reached_hang.wait(), 5)
    assert not session.closed.is_set()
    call.cancel()
    await asyncio.wait_for(session.closed.wait(), 5)
    await asyncio.wait_for(session.events_finalized.wait(), 5)


async def test_malformed_request_bytes_are_invalid_argument() -> None:
    core = FakeCore()
    server = build_server(16 * 1024 * 1024, 8)
    add_gateway_api(server, core)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(f"/{SERVICE_NAME}/Generate")(b"\xff\xff\xff\xff\x0f not a message")
            events, error = await collect(call)
    finally:
        await server.stop(None)
    assert not events and error is not None
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "malformed" in error.details()
    assert not core.opened  # refused before the core saw anything


async def test_info_reports_the_stages_deployment_and_is_unavailable_before_it(serve: Serve) -> None:
    core = FakeCore()
    stub = await serve(core)
    info = await stub.Info(gateway_pb2.GatewayInfoRequest())
    assert (info.model_id, list(info.voices), info.sample_rate) == ("qwen3-omni", list(VOICES), 24000)
    assert [s.stage for s in info.stages] == [
        common_pb2.STAGE_THINKER,
        common_pb2.STAGE_TALKER,
        common_pb2.STAGE_CODE2WAV,
    ]
    core.deployment = Deployment()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Info(gateway_pb2.GatewayInfoRequest())
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_default_voice_is_the_talkers_first_when_it_lacks_the_pipelines(serve: Serve) -> None:
    core = FakeCore([DoneEvent([1], [2], "stop", 0, 0, None, None, 0.1)])
    core.deployment = deployment(voices=["serena", "vivian"])
    stub = await serve(core)
    _, error = await collect(stub.Generate(chat()))
    assert error is None
    assert core.opened[0][0].speaker == "serena"
    _, error = await collect(stub.Generate(chat(speaker="ethan")))
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
