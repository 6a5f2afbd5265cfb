"""Run one request through the three stage services: the gateway's data plane.

Opens one bidi stream per stage and forwards each stage's chunks to the next as they arrive (the
stages themselves hold input back in sequential mode, so both modes share this path). Cancelling
the consumer cancels all three calls, which aborts the request in every stage at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import numpy as np

from omnistream.chunk_key import ChunkKey, Stage
from omnistream.convert import MODE_TO_PROTO, sampling_to_proto
from omnistream.errors import InternalError, OmniError, from_grpc
from omnistream.proto.omni.v1 import common_pb2, stage_pb2, stage_pb2_grpc
from omnistream.qwen3_omni.chunk_plan import ChunkPlan
from omnistream.relay import Emit, relay
from omnistream.request import AudioEvent, CodesEvent, DoneEvent, GenerationRequest, TextEvent
from omnistream.server import ERROR_KIND_METADATA_KEY, client_channel_options
from omnistream.tensors import numpy_from_proto

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


@dataclass
class StageStubs:
    thinker: stage_pb2_grpc.ThinkerServiceStub
    talker: stage_pb2_grpc.TalkerServiceStub
    code2wav: stage_pb2_grpc.Code2WavServiceStub

    @classmethod
    def connect(
        cls, thinker: str, talker: str, code2wav: str, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    ):
        opts = client_channel_options(max_message_bytes)
        return cls(
            stage_pb2_grpc.ThinkerServiceStub(grpc.aio.insecure_channel(thinker, options=opts)),
            stage_pb2_grpc.TalkerServiceStub(grpc.aio.insecure_channel(talker, options=opts)),
            stage_pb2_grpc.Code2WavServiceStub(grpc.aio.insecure_channel(code2wav, options=opts)),
        )


def grpc_error(exc: grpc.aio.AioRpcError, stage: str) -> OmniError:
    """Rebuild the stage's domain error, keeping its kind when the stage sent it."""
    kind = None
    for key, value in exc.trailing_metadata() or ():
        if key == ERROR_KIND_METADATA_KEY:
            kind = value
    error = from_grpc(exc.code(), f"{stage}: {exc.details()}")
    if kind is not None:
        error.kind = kind
    return error


def grpc_error_from_status(stage: str, code: grpc.StatusCode, details: str) -> OmniError:
    error = from_grpc(code, f"{stage}: {details}")
    error.stage = stage
    return error


def thinker_open(
    request: GenerationRequest, rid: str, prompt_ids: list[int] | None
) -> stage_pb2.ThinkerRequest:
    open_ = stage_pb2.ThinkerOpen(
        request_id=rid,
        max_tokens=request.max_tokens,
        ignore_eos=request.ignore_eos,
        sampling=sampling_to_proto(request.sampling),
        mode=MODE_TO_PROTO[request.mode],
    )
    if prompt_ids is not None:
        open_.prompt_ids.extend(prompt_ids)
    else:
        open_.messages.extend(
            common_pb2.Message(role=m["role"], content=m["content"]) for m in request.messages or []
        )
    return stage_pb2.ThinkerRequest(open=open_, key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto())


async def run_request(
    stubs: StageStubs,
    request: GenerationRequest,
    rid: str,
    plan: ChunkPlan,
    timeout: float | None = None,
    with_codes: bool = False,
) -> AsyncIterator[TextEvent | CodesEvent | AudioEvent | DoneEvent]:
    """Events of one request; codec frames as CodesEvents only `with_codes` (tests and tools that
    compare codes): a client never sees them, so the gateway does not decode them per frame."""
    request.validate()
    started = time.perf_counter()
    out: Emit  # set by run_all: hands an event to the consumer
    thinker = stubs.thinker.Stream(timeout=timeout)
    talker = stubs.talker.Stream(timeout=timeout) if request.return_audio else None
    code2wav = stubs.code2wav.Stream(timeout=timeout) if request.return_audio else None
    calls = [c for c in (thinker, talker, code2wav) if c is not None]
    mode = MODE_TO_PROTO[request.mode]
    state = {"prompt_ids": [], "output_ids": [], "reason": "stop", "frames": 0, "samples": 0}
    marks: dict[str, float] = {}
    talker_done = asyncio.Event()

    async def guarded(stage: str, body) -> None:
        try:
            await body()
        except grpc.aio.AioRpcError as exc:
            error = grpc_error(exc, stage)
            error.stage = stage  # the gateway takes a failed replica out of rotation
            raise error from None

    async def accepted(stage: str, call) -> None:
        """Wait for the stage to accept its open message (initial metadata) or to refuse it."""
        await call.initial_metadata()
        if call.done():
            raise grpc_error_from_status(stage, await call.code(), await call.details())

    async def open_talker() -> None:
        assert talker is not None
        await talker.write(
            stage_pb2.TalkerRequest(
                key=ChunkKey(rid, Stage.THINKER, 0).to_proto(),
                open=stage_pb2.TalkerOpen(
                    request_id=rid,
                    speaker=request.speaker,
                    max_frames=request.max_audio_frames,
                    sampling=sampling_to_proto(request.talker_sampling),
                    mode=mode,
                    initial_chunk_frames=plan.initial,
                    chunk_frames=plan.chunk,
                    left_context_frames=plan.left_context,
                ),
            )
        )
        await accepted("talker", talker)

    async def open_code2wav() -> None:
        assert code2wav is not None
        await code2wav.write(
            stage_pb2.Code2WavRequest(
                key=ChunkKey(rid, Stage.TALKER, 0).to_proto(),
                open=stage_pb2.Code2WavOpen(
                    request_id=rid,
                    mode=mode,
                    initial_chunk_frames=plan.initial,
                    chunk_frames=plan.chunk,
                    left_context_frames=plan.left_context,
                ),
            )
        )
        await accepted("code2wav", code2wav)

    async def run_thinker() -> None:
        await thinker.write(thinker_open(request, rid, request.prompt_ids))
        await thinker.done_writing()
        index = 1
        talker_closed = False
        async for chunk in thinker:
            if chunk.prompt_ids:
                state["prompt_ids"] = list(chunk.prompt_ids)
            state["output_ids"].extend(chunk.token_ids)
            marks.setdefault("ttft", time.perf_counter())
            await out(TextEvent(list(chunk.token_ids), chunk.text_delta))
            if talker is not None and talker_done.is_set() and not talker_closed:
                # The talker finished first (codec EOS, max frames): its input is moot now.
                talker_closed = True
                with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                    await talker.done_writing()
            if talker is not None and not talker_closed:
                with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                    await talker.write(
                        stage_pb2.TalkerRequest(
                            key=ChunkKey(rid, Stage.THINKER, index).to_proto(),
                            input=stage_pb2.TalkerInput(
                                prompt_ids=chunk.prompt_ids, token_ids=chunk.token_ids, last=chunk.finished
                            ),
                        )
                    )
                index += 1
            if chunk.finished:
                state["reason"] = chunk.finish_reason or "stop"
        if talker is not None and not talker_closed:
            with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                await talker.done_writing()

    async def run_talker() -> None:
        assert talker is not None and code2wav is not None
        index = 1
        async for chunk in talker:
            codes = numpy_from_proto(chunk.codes, field="codes")
            for j in range(codes.shape[1] if with_codes and codes.ndim == 2 else 0):
                await out(CodesEvent(chunk.first_frame + j, codes[:, j].tolist()))
            state["frames"] += codes.shape[1] if codes.ndim == 2 else 0
            if chunk.finished:
                talker_done.set()
            await code2wav.write(
                stage_pb2.Code2WavRequest(
                    key=ChunkKey(rid, Stage.TALKER, index).to_proto(),
                    input=stage_pb2.CodecInput(
                        codes=chunk.codes, first_frame=chunk.first_frame, last=chunk.finished
                    ),
                )
            )
            index += 1
        await code2wav.done_writing()

    async def run_code2wav() -> None:
        assert code2wav is not None
        async for chunk in code2wav:
            audio = numpy_from_proto(chunk.audio, field="audio")
            if audio.size:
                if not chunk.sample_rate:
                    raise InternalError("code2wav sent audio without its sample rate")
                marks.setdefault("ttfp", time.perf_counter())
                state["samples"] += audio.size
                await out(
                    AudioEvent(
                        np.asarray(audio, dtype=np.float32), int(chunk.first_sample), chunk.sample_rate
                    )
                )

    async def run_all(emit: Emit) -> None:
        nonlocal out
        out = emit
        if talker is not None:
            # Both accept their open before any thinker output can be forwarded to them.
            await asyncio.gather(guarded("talker", open_talker), guarded("code2wav", open_code2wav))
        tasks = [guarded("thinker", run_thinker)]
        if talker is not None:
            tasks += [guarded("talker", run_talker), guarded("code2wav", run_code2wav)]
        await asyncio.gather(*tasks)

    try:
        async for item in relay(run_all):
            yield item
        yield DoneEvent(
            prompt_ids=state["prompt_ids"],
            output_ids=state["output_ids"],
            finish_reason=state["reason"],
            frames=state["frames"],
            audio_samples=state["samples"],
            ttft=marks["ttft"] - started if "ttft" in marks else None,
            ttfp=marks["ttfp"] - started if "ttfp" in marks else None,
            e2e=time.perf_counter() - started,
        )
    finally:
        for call in calls:
            call.cancel()
