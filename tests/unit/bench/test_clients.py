"""The bench's clients record every audio chunk's arrival (time, samples, rate) for the listener,
whatever the transport; and a workload's chunk schedule reaches each wire."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time

import httpx
import numpy as np

from omnistream.bench.clients import (
    GrpcGatewayClient,
    InProcessClient,
    RestGatewayClient,
    Workload,
    grpc_request,
    rest_body,
)
from omnistream.proto.omni.v1 import gateway_pb2, stage_pb2
from omnistream.request.generation import AudioEvent, DoneEvent, TextEvent
from omnistream.wire.tensors import to_proto


def test_a_workloads_schedule_names_its_target_and_reaches_every_wire():
    assert Workload().label == ""
    assert Workload(codec_chunk_schedule="fixed").label == "[fixed]"
    assert Workload(codec_chunk_schedule="grow", audio_input_seconds=5).label == "[grow]+audio-in-5s"
    given = Workload(codec_chunk_schedule="fixed").request_input([1, 2, 3], True)
    assert given.codec_chunk_schedule == "fixed"
    assert grpc_request(given).codec_chunk_schedule == stage_pb2.CHUNK_SCHEDULE_FIXED
    grow = Workload(codec_chunk_schedule="grow").request_input([1], True)
    assert grpc_request(grow).codec_chunk_schedule == stage_pb2.CHUNK_SCHEDULE_GROWING
    as_text = {"prompt_ids": None, "messages": [{"role": "user", "content": "x"}]}
    assert rest_body(dataclasses.replace(grow, **as_text))["codec_chunk_schedule"] == "grow"
    # Not given: not sent, so the gateway's table decides.
    default = Workload().request_input([1], True)
    assert grpc_request(default).codec_chunk_schedule == stage_pb2.CHUNK_SCHEDULE_UNSPECIFIED
    assert "codec_chunk_schedule" not in rest_body(dataclasses.replace(default, **as_text))


def _done() -> DoneEvent:
    return DoneEvent([1], [2], "length", 0, 0, None, None, 0.0)


class _Pipeline:
    """Stands in for the in-process pipeline: two audio chunks at two rates, one empty."""

    async def generate(self, request):
        yield TextEvent([5], "hi")
        yield AudioEvent(np.zeros(2400, np.float32), 0, 24_000)
        yield AudioEvent(np.zeros(0, np.float32), 2400, 24_000)
        yield AudioEvent(np.zeros(1600, np.float32), 2400, 16_000)
        yield _done()


def test_in_process_client_records_each_audio_chunk():
    result = asyncio.run(InProcessClient(_Pipeline()).run([1, 2], Workload(), True))
    assert result.ok, result.error
    assert [(a.samples, a.sample_rate) for a in result.audio_chunks] == [(2400, 24_000), (1600, 16_000)]
    assert result.audio_chunks[0].time <= result.audio_chunks[1].time
    assert result.listening().chunks == 2


class _Stub:
    def __init__(self, events: list) -> None:
        self.events = events

    def Generate(self, request):  # the gRPC method's name
        async def stream():
            for event in self.events:
                yield event

        return stream()


def test_grpc_client_records_each_audio_chunk_at_its_rate():
    audio = gateway_pb2.GenerateEvent.AudioChunk
    events = [
        gateway_pb2.GenerateEvent(audio=audio(pcm=to_proto(np.zeros(480, np.float32)), sample_rate=24_000)),
        gateway_pb2.GenerateEvent(audio=audio(pcm=to_proto(np.zeros(160, np.float32)), sample_rate=16_000)),
        gateway_pb2.GenerateEvent(end=gateway_pb2.GenerateEvent.End()),
    ]

    async def go():
        client = GrpcGatewayClient("127.0.0.1:1")
        client.stub = _Stub(events)
        try:
            return await client.run([1, 2], Workload(), True)
        finally:
            await client.close()

    result = asyncio.run(go())
    assert result.ok, result.error
    assert [(a.samples, a.sample_rate) for a in result.audio_chunks] == [(480, 24_000), (160, 16_000)]


class _Tokenizer:
    def decode(self, ids, skip_special_tokens=True) -> str:
        return "hello"


def _sse(*chunks: dict) -> bytes:
    lines = [f"data: {json.dumps(c)}\n\n" for c in chunks] + ["data: [DONE]\n\n"]
    return "".join(lines).encode()


def test_rest_client_decodes_pcm16_at_the_rate_the_gateway_reports():
    pcm = base64.b64encode(np.zeros(800, np.int16).tobytes()).decode()  # 800 samples
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            card = {"id": "m", "omnistream": {"sample_rate": 16_000}}
            return httpx.Response(200, json={"object": "list", "data": [card]})
        seen.append(json.loads(request.content))
        body = _sse(
            {"choices": [{"delta": {"audio": {"transcript": "hi"}}}]},
            {"choices": [{"delta": {"audio": {"data": pcm}}}]},
            {"choices": [{"delta": {"audio": {"data": pcm}}}]},
        )
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def go():
        client = RestGatewayClient("http://gateway", _Tokenizer(), sample_rate=24_000)
        client.client = httpx.AsyncClient(base_url="http://gateway", transport=httpx.MockTransport(handler))
        try:
            return await client.run(list(range(12)), Workload(codec_chunk_schedule="fixed"), True)
        finally:
            await client.close()

    started = time.perf_counter()
    result = asyncio.run(go())
    assert result.ok, result.error
    assert [(a.samples, a.sample_rate) for a in result.audio_chunks] == [(800, 16_000), (800, 16_000)]
    assert started <= result.audio_chunks[0].time <= result.audio_chunks[1].time
    assert abs(result.audio_seconds - 0.1) < 1e-12
    assert seen[0]["codec_chunk_schedule"] == "fixed"


def test_rest_client_keeps_the_models_rate_when_the_gateway_does_not_say():
    pcm = base64.b64encode(np.zeros(480, np.int16).tobytes()).decode()

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(503, json={"error": {"message": "not ready"}})
        body = _sse({"choices": [{"delta": {"audio": {"data": pcm}}}]})
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    async def go():
        client = RestGatewayClient("http://gateway", _Tokenizer(), sample_rate=24_000)
        client.client = httpx.AsyncClient(base_url="http://gateway", transport=httpx.MockTransport(handler))
        try:
            return await client.run(list(range(12)), Workload(), True)
        finally:
            await client.close()

    result = asyncio.run(go())
    assert result.ok, result.error
    assert [(a.samples, a.sample_rate) for a in result.audio_chunks] == [(480, 24_000)]
