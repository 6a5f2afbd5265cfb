"""Calls to the stage services that the stage tests share: whole requests and raw streams."""

from __future__ import annotations

import grpc
import numpy as np

from gateway.serving.stage_calls import StageStubs, run_request
from omnistream.models.qwen3_omni.codec_chunks import ChunkPlan
from omnistream.pipeline import AudioEvent, GenerationRequest, TextEvent
from omnistream.proto.omni.v1 import common_pb2, stage_pb2
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.tensors import to_proto


def make_request(messages, mode="async", **kw) -> GenerationRequest:
    base = {"max_tokens": 24, "max_audio_frames": 40, "initial_codec_chunk_frames": 4, "mode": mode}
    return GenerationRequest(messages=messages, **{**base, **kw})


def stubs(stages) -> StageStubs:
    return StageStubs.connect(*(stages[s].address for s in ("thinker", "talker", "code2wav")))


def request_plan(request: GenerationRequest) -> ChunkPlan:
    """The plan the gateway would open the request's stages with (its initial frames, or 4)."""
    return ChunkPlan(
        request.initial_codec_chunk_frames or 4,
        request.codec_chunk_frames,
        request.codec_left_context_frames,
        request.codec_chunk_schedule,
    ).validate()


async def collect_services(
    stages, request: GenerationRequest, rid: str, sizes: list[int] | None = None, refer_audio=None
):
    """(text, codes, audio, done event) of one request through the stages; `sizes` (if given)
    gets each audio chunk's sample count; `refer_audio`: run_stages' (audio parts as digests)."""
    text, frames, audio, done = [], [], [], None
    plan = request_plan(request)
    async for event in run_request(
        stubs(stages), request, rid, plan, with_codes=True, refer_audio=refer_audio
    ):
        if isinstance(event, TextEvent):
            text.append(event.delta)
        elif isinstance(event, AudioEvent):
            audio.append(event.audio)
            if sizes is not None:
                sizes.append(event.audio.size)
        elif hasattr(event, "codes"):
            frames.append(event.codes)
        else:
            done = event
    return "".join(text), np.array(frames).T, np.concatenate(audio), done


async def raw_stream(stub_call, messages, timeout=30):
    """Send `messages` on a fresh bidi call; return (status code, details)."""
    call = stub_call(timeout=timeout)
    try:
        for message in messages:
            await call.write(message)
        await call.done_writing()
        async for _ in call:
            pass
        return grpc.StatusCode.OK, ""
    except grpc.aio.AioRpcError as exc:
        return exc.code(), exc.details()


def talker_open(rid: str, **kw) -> stage_pb2.TalkerRequest:
    return stage_pb2.TalkerRequest(
        key=ChunkKey(rid, Stage.THINKER, 0).to_proto(),
        open=stage_pb2.TalkerOpen(request_id=rid, max_frames=5, **kw),
    )


def talker_input(rid: str, index: int, **kw) -> stage_pb2.TalkerRequest:
    return stage_pb2.TalkerRequest(
        key=ChunkKey(rid, Stage.THINKER, index).to_proto(), input=stage_pb2.TalkerInput(**kw)
    )


def c2w_open(rid: str) -> stage_pb2.Code2WavRequest:
    return stage_pb2.Code2WavRequest(
        key=ChunkKey(rid, Stage.TALKER, 0).to_proto(), open=stage_pb2.Code2WavOpen(request_id=rid)
    )


def c2w_input(rid: str, index: int, codes, first_frame=0, last=True) -> stage_pb2.Code2WavRequest:
    tensor = codes if isinstance(codes, common_pb2.Tensor) else to_proto(codes)
    return stage_pb2.Code2WavRequest(
        key=ChunkKey(rid, Stage.TALKER, index).to_proto(),
        input=stage_pb2.CodecInput(codes=tensor, first_frame=first_frame, last=last),
    )
