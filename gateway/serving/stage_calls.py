"""Run one request through the three stage services: the gateway's data plane.

Opens one bidi stream per stage and forwards each stage's chunks to the next as they arrive (the
stages themselves hold input back in sequential mode, so both modes share this path). Cancelling
the consumer cancels all three calls, which aborts the request in every stage at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import grpc
import numpy as np

from gateway.serving.tracing import StageCalls
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.errors import InternalError, OmniError, Unavailable, from_grpc
from omnistream.request.generation import AudioEvent, CodesEvent, DoneEvent, GenerationRequest, TextEvent
from omnistream.request.relay import Emit, relay
from omnistream.request.stage_chain import TALKER, stage_opens, stages_for
from omnistream.service.server import (
    ERROR_FIELD_METADATA_KEY,
    ERROR_KIND_METADATA_KEY,
    OPEN_ACCEPTED,
    OPEN_METADATA_KEY,
    STAGE_ORIGIN,
    STATUS_ORIGIN_METADATA_KEY,
    client_channel_options,
)
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.convert import (
    Referrer,
    code2wav_open_proto,
    codec_input_proto,
    talker_input_proto,
    talker_open_proto,
    thinker_open_proto,
)
from omnistream.wire.limits import MAX_MESSAGE_BYTES
from omnistream.wire.tensors import numpy_from_proto


@dataclass
class StageStubs:
    thinker: stage_pb2_grpc.ThinkerServiceStub
    talker: stage_pb2_grpc.TalkerServiceStub
    code2wav: stage_pb2_grpc.Code2WavServiceStub

    @classmethod
    def connect(cls, thinker: str, talker: str, code2wav: str, max_message_bytes: int = MAX_MESSAGE_BYTES):
        opts = client_channel_options(max_message_bytes)
        return cls(
            stage_pb2_grpc.ThinkerServiceStub(grpc.aio.insecure_channel(thinker, options=opts)),
            stage_pb2_grpc.TalkerServiceStub(grpc.aio.insecure_channel(talker, options=opts)),
            stage_pb2_grpc.Code2WavServiceStub(grpc.aio.insecure_channel(code2wav, options=opts)),
        )


# What gRPC reports when the link broke and no status came from the stage: UNAVAILABLE (reset, peer
# gone, keepalive timeout), INTERNAL "Internal error from Core" (the transport broke under a read or
# write, grpc/grpc#36066), UNKNOWN or CANCELLED (an RST_STREAM the stage's code never sent).
_codes = grpc.StatusCode
LINK_FAILURE_CODES = frozenset({_codes.UNAVAILABLE, _codes.INTERNAL, _codes.UNKNOWN, _codes.CANCELLED})
# A stage's initial metadata without the acceptance mark: its call is checked this often for the
# status of a refusal before it counts as accepted (50 ms, once per call, only for a stage that
# predates the mark).
UNMARKED_OPEN_CHECKS = 10
UNMARKED_OPEN_CHECK_S = 0.005


def stage_error(
    stage: str,
    code: grpc.StatusCode,
    details: str | None,
    trailing_metadata: Iterable[tuple[str, str | bytes]] | None = None,
) -> OmniError:
    """The domain error for a failed call to `stage`, with `error.stage` set.

    A status the stage sent itself carries its marker (`omni-status-origin: stage`, set by
    `abort_with`; a stage from before the marker sent its error kind alone) and is rebuilt as it is:
    the stage's own INTERNAL stays an engine bug. Without the marker the status was made by gRPC on
    this side, so a broken link is the stage being unavailable, whatever code gRPC chose: the client
    may retry, the replica leaves the rotation, and a request with no output yet moves to another
    replica (GatewayCore.open). Unmarked codes a broken link never makes (this side's deadline or
    message limit) keep their meaning.
    """
    metadata = {key: value for key, value in trailing_metadata or ()}
    kind = metadata.get(ERROR_KIND_METADATA_KEY)
    origin = metadata.get(STATUS_ORIGIN_METADATA_KEY)
    sent_by_stage = origin == STAGE_ORIGIN or (origin is None and kind is not None)
    if not sent_by_stage and code in LINK_FAILURE_CODES:
        error: OmniError = Unavailable(f"{stage}: connection to the stage lost ({code.name}: {details})")
    else:
        error = from_grpc(code, f"{stage}: {details}")
        if sent_by_stage and kind is not None:
            error.kind = kind
        if sent_by_stage and metadata.get(ERROR_FIELD_METADATA_KEY):  # the field it names: the client's param
            error.field = str(metadata[ERROR_FIELD_METADATA_KEY])
    error.stage = stage  # the gateway takes a failed replica out of rotation
    return error


def grpc_error(exc: grpc.aio.AioRpcError, stage: str) -> OmniError:
    """`stage_error` for a raised call error."""
    return stage_error(stage, exc.code(), exc.details(), exc.trailing_metadata())


async def run_stages(
    stubs: StageStubs,
    request: GenerationRequest,
    rid: str,
    plan: ChunkPlan,
    emit: Emit,
    timeout: float | None = None,
    with_codes: bool = False,
    trace: StageCalls | None = None,
    refer_audio: Referrer | None = None,
) -> DoneEvent:
    """Run one request through the stages, handing each event to `emit` as it comes; returns the
    summary. `emit` is the request's one buffer (the gateway's per-client collector), so nothing
    queues between the stages and it. Codec frames become CodesEvents only `with_codes` (tests and
    tools that compare codes): a client never sees them, so the gateway does not decode them.
    `trace`: the CLIENT spans of the calls (gateway/serving/tracing.py), each call's `traceparent`
    in its metadata; ended here however the calls end. `refer_audio`: the audio parts the thinker
    replica holds for the request's scope, sent as their digests (gateway/serving/sent_audio.py)."""
    request.validate()
    started = time.perf_counter()
    opens = stage_opens(request, plan)
    audio = TALKER in stages_for(request)

    def stream(stub, stage: str):
        if trace is None:  # tracing off: the call as it always was
            return stub.Stream(timeout=timeout)
        return stub.Stream(timeout=timeout, metadata=trace.metadata(stage))

    thinker = stream(stubs.thinker, "thinker")
    talker = stream(stubs.talker, "talker") if audio else None
    code2wav = stream(stubs.code2wav, "code2wav") if audio else None
    calls = [c for c in (thinker, talker, code2wav) if c is not None]
    state = {"prompt_ids": [], "output_ids": [], "reason": "stop", "frames": 0, "samples": 0, "cached": 0}
    marks: dict[str, float] = {}
    talker_done = asyncio.Event()
    # The audio stages' acceptance of their open messages (one event each): the thinker's open goes
    # out with theirs, and its output waits for both only where it is handed on.
    accepted_by = {"talker": asyncio.Event(), "code2wav": asyncio.Event()} if audio else {}

    async def guarded(stage: str, body) -> None:
        call = {"thinker": thinker, "talker": talker, "code2wav": code2wav}[stage]
        async with _calls_to(stage, call, moot_once_ok=False):
            await body()

    async def accepted(stage: str, call) -> None:
        """Wait for the stage to accept its open message (initial metadata that says so) or to
        refuse it (a status: gRPC answers the wait for initial metadata with an empty set first)."""
        metadata = await call.initial_metadata()
        if metadata.get(OPEN_METADATA_KEY) != OPEN_ACCEPTED:
            # A refusal (its status follows the empty initial metadata at once), or a stage from
            # before the mark (omnistream 0.1 during a rollout), which accepts without saying so.
            for _ in range(UNMARKED_OPEN_CHECKS):
                if call.done():
                    raise stage_error(
                        stage, await call.code(), await call.details(), await call.trailing_metadata()
                    )
                await asyncio.sleep(UNMARKED_OPEN_CHECK_S)
        accepted_by[stage].set()

    async def all_accepted() -> None:
        """Both audio stages took their open. Nothing of the thinker reaches the client or them
        before: a stage that refuses still fails the request before its first event (so the gateway
        can move it to another replica), and no write goes to a stream its stage refused."""
        for event in accepted_by.values():
            await event.wait()

    async def open_talker() -> None:
        assert talker is not None
        key = ChunkKey(rid, Stage.THINKER, 0).to_proto()
        await talker.write(stage_pb2.TalkerRequest(key=key, open=talker_open_proto(rid, opens)))
        await accepted("talker", talker)

    async def open_code2wav() -> None:
        assert code2wav is not None
        key = ChunkKey(rid, Stage.TALKER, 0).to_proto()
        await code2wav.write(stage_pb2.Code2WavRequest(key=key, open=code2wav_open_proto(rid, opens)))
        await accepted("code2wav", code2wav)

    async def run_thinker() -> None:
        open_ = thinker_open_proto(
            rid, opens, request.messages, request.prompt_ids, request.tools, refer_audio
        )
        key = ChunkKey(rid, Stage.GATEWAY, 0).to_proto()
        await thinker.write(stage_pb2.ThinkerRequest(open=open_, key=key))
        await thinker.done_writing()
        index = 1
        talker_closed = False
        async for chunk in thinker:
            if chunk.prompt_ids:
                state["prompt_ids"] = list(chunk.prompt_ids)
                state["cached"] = chunk.cached_tokens
            state["output_ids"].extend(chunk.token_ids)
            marks.setdefault("ttft", time.perf_counter())
            await all_accepted()  # at once after the first chunk: they accept in a round trip
            await emit(TextEvent(list(chunk.token_ids), chunk.text_delta))
            if talker is not None and talker_done.is_set() and not talker_closed:
                # The talker finished first (codec EOS, max frames): its input is moot now.
                talker_closed = True
                with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                    await talker.done_writing()
            if talker is not None and not talker_closed:
                with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                    key = ChunkKey(rid, Stage.THINKER, index).to_proto()
                    await talker.write(stage_pb2.TalkerRequest(key=key, input=talker_input_proto(chunk)))
                index += 1
            if chunk.finished:
                state["reason"] = chunk.finish_reason or "stop"
        if talker is not None and not talker_closed:
            await all_accepted()
            with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
                await talker.done_writing()

    async def run_talker() -> None:
        assert talker is not None and code2wav is not None
        index = 1
        async for chunk in talker:
            frames = chunk.codes.shape[1] if len(chunk.codes.shape) == 2 else 0
            if with_codes and frames:
                codes = numpy_from_proto(chunk.codes, field="codes")
                for j in range(frames):
                    await emit(CodesEvent(chunk.first_frame + j, codes[:, j].tolist()))
            state["frames"] += frames
            if chunk.finished:
                talker_done.set()
            message = stage_pb2.Code2WavRequest(
                key=ChunkKey(rid, Stage.TALKER, index).to_proto(), input=codec_input_proto(chunk)
            )
            # A failed write is code2wav's link failing, not the talker's (this pump runs as "talker").
            async with _calls_to("code2wav", code2wav):
                await code2wav.write(message)
            index += 1
        async with _calls_to("code2wav", code2wav):
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
                rate = chunk.sample_rate
                await emit(AudioEvent(np.asarray(audio, dtype=np.float32), int(chunk.first_sample), rate))

    async def talker_stage() -> None:
        await open_talker()
        await run_talker()

    async def code2wav_stage() -> None:
        await open_code2wav()
        await run_code2wav()

    ended: BaseException | None = None
    try:
        # All three open at once: the thinker's prompt is under way while the audio stages accept
        # (a round trip each, ~4 ms of every request's TTFT when they came first).
        tasks = [guarded("thinker", run_thinker)]
        if audio:
            tasks += [guarded("talker", talker_stage), guarded("code2wav", code2wav_stage)]
        await _all_or_none(tasks)
        return DoneEvent(
            prompt_ids=state["prompt_ids"],
            output_ids=state["output_ids"],
            finish_reason=state["reason"],
            frames=state["frames"],
            audio_samples=state["samples"],
            ttft=marks["ttft"] - started if "ttft" in marks else None,
            ttfp=marks["ttfp"] - started if "ttfp" in marks else None,
            e2e=time.perf_counter() - started,
            cached_tokens=state["cached"],
        )
    except BaseException as exc:
        ended = exc
        raise
    finally:
        for call in calls:
            call.cancel()
        if trace is not None:
            trace.end(ended, _call_results(state, marks, started))


def _call_results(state: dict, marks: dict[str, float], started: float) -> dict[str, dict]:
    """What each stage call produced, as its CLIENT span's attributes."""
    thinker = {
        "gen_ai.usage.prompt_tokens": len(state["prompt_ids"]),
        "gen_ai.usage.completion_tokens": len(state["output_ids"]),
    }
    if "ttft" in marks:
        thinker["gen_ai.latency.time_to_first_token"] = marks["ttft"] - started
    code2wav = {"omnistream.audio.samples": state["samples"]}
    if "ttfp" in marks:
        code2wav["omnistream.audio.time_to_first_audio"] = marks["ttfp"] - started
    return {"thinker": thinker, "talker": {"omnistream.audio.frames": state["frames"]}, "code2wav": code2wav}


@contextlib.asynccontextmanager
async def _calls_to(stage: str, call: grpc.aio.Call | None, moot_once_ok: bool = True) -> AsyncIterator[None]:
    """Name `stage` in a call error raised inside (a write to one stage from another's pump). A
    write to a call that has already ended raises no status of its own ("RPC already finished"):
    the call's own status is raised instead (a link cut ends the call before the write: its
    UNAVAILABLE); with `moot_once_ok`, a write to a call that ended by itself is moot."""
    try:
        yield
    except grpc.aio.AioRpcError as exc:
        raise grpc_error(exc, stage) from None
    except asyncio.InvalidStateError:
        if call is None or not call.done():
            raise
        code = await call.code()
        if code == grpc.StatusCode.OK:
            if moot_once_ok:
                return
            raise
        raise stage_error(stage, code, await call.details(), await call.trailing_metadata()) from None


async def _all_or_none(coros: list) -> None:
    """Run the pumps together; the first failure cancels the others and is raised as it is."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            if task.exception() is not None:
                raise task.exception()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_request(
    stubs: StageStubs,
    request: GenerationRequest,
    rid: str,
    plan: ChunkPlan,
    timeout: float | None = None,
    with_codes: bool = False,
    refer_audio: Referrer | None = None,
) -> AsyncIterator[TextEvent | CodesEvent | AudioEvent | DoneEvent]:
    """`run_stages` as an iterator of events ending with the DoneEvent (tests and tools)."""

    async def body(emit: Emit) -> None:
        done = await run_stages(stubs, request, rid, plan, emit, timeout, with_codes, refer_audio=refer_audio)
        await emit(done)

    async for item in relay(body):
        yield item
