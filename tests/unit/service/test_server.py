from __future__ import annotations

import asyncio
import os
import signal
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.request.errors import InvalidRequest
from omnistream.service.server import (
    CONTROL_RPC_HEADROOM,
    ERROR_KIND_METADATA_KEY,
    KEEPALIVE_ENV,
    STAGE_ORIGIN,
    STATUS_ORIGIN_METADATA_KEY,
    StageHealth,
    abort_with,
    add_health_and_reflection,
    build_server,
    client_channel_options,
    serve_until_signal,
    server_options,
    set_serving,
    start_metrics_http,
)
from omnistream.wire.chunk_key import ChunkKey, SequenceChecker, Stage
from omnistream.wire.tensors import from_proto, to_proto

SERVICE = stage_pb2.DESCRIPTOR.services_by_name["Code2WavService"].full_name
SERVER_MAX_BYTES = 64 * 1024
MAX_STREAMS = 2


class FakeCode2Wav(stage_pb2_grpc.Code2WavServiceServicer):
    """Emits `samples_per_frame` zeros per input frame; enough to exercise limits and error mapping."""

    def __init__(self, samples_per_frame: int = 4) -> None:
        self.samples_per_frame = samples_per_frame
        self.active = 0

    async def Stream(
        self, request_iterator: AsyncIterator[stage_pb2.Code2WavRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[stage_pb2.AudioChunk]:
        self.active += 1
        try:
            checker: SequenceChecker | None = None
            out = ChunkKey("unset", Stage.CODE2WAV, 0)
            first_sample = 0
            async for req in request_iterator:
                if checker is None:
                    if req.WhichOneof("kind") != "open":
                        raise InvalidRequest("the first message must be an open")
                    checker = SequenceChecker(req.open.request_id, Stage.TALKER)
                    out = ChunkKey(req.open.request_id, Stage.CODE2WAV, 0)
                checker.expect(req.key)
                if req.WhichOneof("kind") != "input":
                    continue
                codes = from_proto(req.input.codes, field="codes", expect_dtype="int64")
                if codes.numel() and int(codes.min()) < 0:
                    raise RuntimeError("secret internal detail")
                audio = torch.zeros(codes.shape[1] * self.samples_per_frame)
                yield stage_pb2.AudioChunk(
                    key=out.to_proto(),
                    audio=to_proto(audio),
                    sample_rate=24_000,
                    first_sample=first_sample,
                    finished=req.input.last,
                )
                out, first_sample = out.next(), first_sample + audio.numel()
                if req.input.last:
                    return
        except Exception as e:
            await abort_with(context, e)
        finally:
            self.active -= 1


@dataclass
class Running:
    server: grpc.aio.Server
    health: StageHealth
    fake: FakeCode2Wav
    target: str


@pytest.fixture
async def running() -> AsyncIterator[Running]:
    server = build_server(SERVER_MAX_BYTES, MAX_STREAMS)
    fake = FakeCode2Wav()
    stage_pb2_grpc.add_Code2WavServiceServicer_to_server(fake, server)
    health = add_health_and_reflection(server, [SERVICE])
    port = server.add_insecure_port("127.0.0.1:0")
    assert port > 0
    await server.start()
    try:
        yield Running(server, health, fake, f"127.0.0.1:{port}")
    finally:
        await server.stop(None)


def _channel(target: str, max_bytes: int = 4 * 1024 * 1024) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=client_channel_options(max_bytes))


async def _status(channel: grpc.aio.Channel, service: str) -> int:
    resp = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))
    return resp.status


def _open(rid: str) -> stage_pb2.Code2WavRequest:
    return stage_pb2.Code2WavRequest(
        key=ChunkKey(rid, Stage.TALKER, 0).to_proto(), open=stage_pb2.Code2WavOpen(request_id=rid)
    )


def _input(rid: str, index: int, frames: int, last: bool = False, fill: int = 1) -> stage_pb2.Code2WavRequest:
    return stage_pb2.Code2WavRequest(
        key=ChunkKey(rid, Stage.TALKER, index).to_proto(),
        input=stage_pb2.CodecInput(codes=to_proto(torch.full((16, frames), fill)), last=last),
    )


async def test_health_starts_not_serving_then_serves(running: Running) -> None:
    NOT_SERVING, SERVING = health_pb2.HealthCheckResponse.NOT_SERVING, health_pb2.HealthCheckResponse.SERVING
    async with _channel(running.target) as channel:
        assert await _status(channel, "") == NOT_SERVING
        assert await _status(channel, SERVICE) == NOT_SERVING
        await set_serving(running.health, True)
        assert await _status(channel, "") == SERVING
        assert await _status(channel, SERVICE) == SERVING
        await set_serving(running.health, False)
        assert await _status(channel, SERVICE) == NOT_SERVING
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _status(channel, "omni.v1.NoSuchService")
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_and_resolves_services(running: Running) -> None:
    async with _channel(running.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [
            reflection_pb2.ServerReflectionRequest(list_services=""),
            reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE),
        ]
        responses = [r async for r in stub.ServerReflectionInfo(iter(requests))]
    names = {s.name for s in responses[0].list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names
    assert responses[1].file_descriptor_response.file_descriptor_proto  # stage.proto (+ its imports)


async def test_stream_round_trip(running: Running) -> None:
    async with _channel(running.target) as channel:
        call = stage_pb2_grpc.Code2WavServiceStub(channel).Stream(
            iter([_open("r1"), _input("r1", 1, 3), _input("r1", 2, 0, last=True)])
        )
        chunks = [c async for c in call]
    assert [str(ChunkKey.from_proto(c.key)) for c in chunks] == ["r1_code2wav_0", "r1_code2wav_1"]
    assert [from_proto(c.audio).numel() for c in chunks] == [12, 0]
    assert [c.first_sample for c in chunks] == [0, 12]
    assert [c.finished for c in chunks] == [False, True]


async def test_too_large_request_is_resource_exhausted(running: Running) -> None:
    async with _channel(running.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _status(channel, "x" * (SERVER_MAX_BYTES + 1))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        big_frames = SERVER_MAX_BYTES // (16 * 8) + 1  # int64 codes just over the server's limit
        call = stage_pb2_grpc.Code2WavServiceStub(channel).Stream(
            iter([_open("r2"), _input("r2", 1, big_frames, last=True)])
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [c async for c in call]
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_too_large_response_is_resource_exhausted(running: Running) -> None:
    running.fake.samples_per_frame = 1024  # 4 KiB of float32 per frame
    async with _channel(running.target, max_bytes=16 * 1024) as channel:
        call = stage_pb2_grpc.Code2WavServiceStub(channel).Stream(
            iter([_open("r3"), _input("r3", 1, 8, last=True)])  # 32 KiB response > 16 KiB client limit
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [c async for c in call]
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_abort_with_maps_domain_errors_and_hides_internals(running: Running) -> None:
    async with _channel(running.target) as channel:
        stub = stage_pb2_grpc.Code2WavServiceStub(channel)
        gap = stub.Stream(iter([_open("r4"), _input("r4", 2, 1, last=True)]))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [c async for c in gap]
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "r4_talker_2 skips 1 chunk(s) (expected r4_talker_1)" in (info.value.details() or "")
        assert (ERROR_KIND_METADATA_KEY, "sequence_error") in tuple(info.value.trailing_metadata() or ())

        crash = stub.Stream(iter([_open("r5"), _input("r5", 1, 1, last=True, fill=-1)]))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            _ = [c async for c in crash]
        assert info.value.code() == grpc.StatusCode.INTERNAL
        assert info.value.details() == "internal error (RuntimeError)"
        assert (ERROR_KIND_METADATA_KEY, "internal") in tuple(info.value.trailing_metadata() or ())
        # the mark that tells the gateway this INTERNAL is the stage's own, not a broken link's
        assert (STATUS_ORIGIN_METADATA_KEY, STAGE_ORIGIN) in tuple(info.value.trailing_metadata() or ())


async def test_concurrency_limit_keeps_headroom_for_health(running: Running) -> None:
    limit = MAX_STREAMS + CONTROL_RPC_HEADROOM
    async with _channel(running.target) as channel:
        stub = stage_pb2_grpc.Code2WavServiceStub(channel)
        calls = []
        try:
            for i in range(limit - 1):
                call = stub.Stream()
                await call.write(_open(f"busy{i}"))
                calls.append(call)
            for _ in range(200):
                if running.fake.active == limit - 1:
                    break
                await asyncio.sleep(0.01)
            assert running.fake.active == limit - 1
            # The last admitted slot still answers health; the next RPC is refused.
            await _status(channel, "")
            extra = stub.Stream()
            await extra.write(_open("busy-extra"))
            calls.append(extra)
            for _ in range(200):
                if running.fake.active == limit:
                    break
                await asyncio.sleep(0.01)
            assert running.fake.active == limit
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await _status(channel, "")
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        finally:
            for call in calls:
                call.cancel()


async def test_serve_until_stop_event_drains_in_order(running: Running) -> None:
    events: list[str] = []
    await set_serving(running.health, True)

    async def on_drain() -> None:
        async with _channel(running.target) as channel:
            status = await _status(channel, SERVICE)
        events.append(f"drain:{health_pb2.HealthCheckResponse.ServingStatus.Name(status)}")

    stop = asyncio.Event()
    task = asyncio.create_task(serve_until_signal(running.server, running.health, 1.0, on_drain, stop=stop))
    await asyncio.sleep(0.05)
    assert not task.done()
    stop.set()
    assert await asyncio.wait_for(task, 10) is None
    assert events == ["drain:NOT_SERVING"]
    # Stopped: a fresh channel cannot reach it any more.
    async with _channel(running.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _status(channel, "")
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_serve_until_sigterm(running: Running) -> None:
    original = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    drained = asyncio.Event()
    try:
        task = asyncio.create_task(serve_until_signal(running.server, running.health, 0.5, drained.set))
        for _ in range(200):  # only send the signal once the handler is surely installed
            if signal.getsignal(signal.SIGTERM) is not original[signal.SIGTERM]:
                break
            await asyncio.sleep(0.01)
        assert signal.getsignal(signal.SIGTERM) is not original[signal.SIGTERM]
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(task, 10) == signal.SIGTERM
        assert drained.is_set()
    finally:
        for sig, handler in original.items():
            signal.signal(sig, handler)


def test_limits_are_explicit_and_bounded() -> None:
    opts = dict(client_channel_options(1234))
    assert opts["grpc.max_send_message_length"] == 1234
    assert opts["grpc.max_receive_message_length"] == 1234
    assert opts["grpc.keepalive_time_ms"] == 20_000
    assert opts["grpc.keepalive_timeout_ms"] == 10_000
    assert opts["grpc.keepalive_permit_without_calls"] == 1
    with pytest.raises(ValueError):
        client_channel_options(-1)
    with pytest.raises(ValueError):
        build_server(0, 4)
    with pytest.raises(ValueError):
        build_server(1024, 0)


def test_metrics_http_binds_ephemeral_port() -> None:
    port = start_metrics_http(0)
    assert port > 0
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")


def test_keepalive_can_be_shortened_for_a_whole_deployment(monkeypatch) -> None:
    monkeypatch.setenv(KEEPALIVE_ENV, "2000,1000")
    client, server = dict(client_channel_options(1234)), dict(server_options(1234))
    assert (client["grpc.keepalive_time_ms"], client["grpc.keepalive_timeout_ms"]) == (2000, 1000)
    assert (server["grpc.keepalive_time_ms"], server["grpc.keepalive_timeout_ms"]) == (2000, 1000)
    # the server still permits the clients' pings (a stricter server closes the link: too_many_pings)
    assert server["grpc.http2.min_recv_ping_interval_without_data_ms"] <= 2000
    for bad in ("2000", "a,b", "50,1000"):
        monkeypatch.setenv(KEEPALIVE_ENV, bad)
        with pytest.raises(ValueError, match=KEEPALIVE_ENV):
            client_channel_options(1234)
