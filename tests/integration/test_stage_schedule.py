"""The talker and Code2Wav as real processes, their step full: the stream closest to running dry
goes first.

Request A runs alone and builds up seconds of buffered audio (both stages run the tiny model far
faster than real time). Then B opens: in arrival order A would take every step until its last
frame and B would get nothing before; served earliest deadline first, B (no audio yet, so due
`--first-audio-target` after it arrived) takes the steps while A waits, and B ends while A still
has most of its audio to go. A is made so long (minutes of audio) that this holds on a slow
machine as well: B is due at a fixed time, A's deadline moves 80 ms later with each frame, so A
overtakes B's deadline after a bounded number of frames however slowly the stage runs. Only
orders are asserted, never times; the stage's own /metrics show the waits it counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest

from omnistream.cli.launcher import ServiceProcess, start_services
from omnistream.engine.chat_encoding import ChatEncoder
from omnistream.models.qwen3_omni.checkpoint import load_tokenizer
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.wire.chunk_key import ChunkKey, Stage

from .conftest import metric, stage_args, wait_for
from .stage_calls import c2w_input, talker_input

AHEAD_FRAMES = 2000  # A's length: 160 s of audio, far more than it gets to emit before B is done
LEAD_FRAMES = 100  # what A has emitted (8 s of audio) when B opens
B_FRAMES = 20
STREAM = [5, 6, 7, 8, 9, 10, 11, 12]  # thinker tokens after the prompt
DEFERRED = "omnistream_stage_deferred_steps_total"


@pytest.fixture(scope="module")
def full_stages(tiny_model_dir):
    """A talker that takes one frame row per step and a Code2Wav that takes one window per step."""
    services = start_services(
        {
            "talker": stage_args("talker", tiny_model_dir, "--max-step-batch", "1"),
            "code2wav": stage_args("code2wav", tiny_model_dir, "--max-batch", "1"),
        }
    )
    try:
        yield services
    finally:
        for service in services.values():
            service.stop()


def _idle(service: ServiceProcess) -> bool:
    return metric(service, "omnistream_stage_engine_requests") == 0


async def _chunks(call, rid: str, log: list[tuple[str, bool]]) -> AsyncIterator[Any]:
    """The call's messages, each noted in `log` (request id, finished) as it arrives."""
    while (chunk := await call.read()) is not grpc.aio.EOF:
        log.append((rid, chunk.finished))
        yield chunk


async def _contend(open_a, open_b, lead: int, frames_of) -> tuple[list[tuple[str, bool]], int, int]:
    """Open A, read it until it has `lead` frames out, open B, read both until B ends; then cancel
    A. Returns the arrival log up to B's last message (A's messages from B's open on, and B's),
    A's frames received by then, and B's frames."""
    log: list[tuple[str, bool]] = []
    a = await open_a()
    a_frames = 0
    while a_frames < lead:
        chunk = await a.read()
        assert chunk is not grpc.aio.EOF and not chunk.finished, "A ended before B could open"
        a_frames += frames_of(chunk)
    b = await open_b()

    async def read_a() -> None:
        nonlocal a_frames
        async for chunk in _chunks(a, "a", log):
            a_frames += frames_of(chunk)

    reader = asyncio.ensure_future(read_a())
    b_frames = 0
    at_b_end: tuple[list[tuple[str, bool]], int] = ([], -1)
    try:
        async for chunk in _chunks(b, "b", log):
            b_frames += frames_of(chunk)
            if chunk.finished:
                at_b_end = list(log), a_frames  # B's end: what had arrived by then, of both
    finally:
        reader.cancel()
        a.cancel()  # A has made its point: no need to wait for minutes of its audio
        await asyncio.gather(reader, return_exceptions=True)
    return (*at_b_end, b_frames)


def _talker_frames(chunk: stage_pb2.TalkerChunk) -> int:
    return chunk.codes.shape[1] if len(chunk.codes.shape) == 2 else 0


def test_the_talker_steps_the_request_with_the_least_buffered_audio_first(full_stages, tiny_model_dir):
    talker = full_stages["talker"]
    prompt = ChatEncoder(load_tokenizer(tiny_model_dir), 256).encode([{"role": "user", "content": "hello"}])

    async def run():
        async with grpc.aio.insecure_channel(talker.address) as channel:
            stub = stage_pb2_grpc.TalkerServiceStub(channel)

            def opener(rid: str, frames: int):
                async def open_call():
                    call = stub.Stream()
                    open_ = stage_pb2.TalkerOpen(
                        request_id=rid, max_frames=frames, initial_chunk_frames=1, chunk_frames=1
                    )
                    await call.write(
                        stage_pb2.TalkerRequest(key=ChunkKey(rid, Stage.THINKER, 0).to_proto(), open=open_)
                    )
                    await call.write(talker_input(rid, 1, prompt_ids=prompt, token_ids=STREAM, last=True))
                    await call.done_writing()
                    return call

                return open_call

            before = metric(talker, DEFERRED)
            result = await _contend(
                opener("edf-a", AHEAD_FRAMES), opener("edf-b", B_FRAMES), LEAD_FRAMES, _talker_frames
            )
            assert await wait_for(lambda: _idle(talker), timeout=30.0)
            return (*result, before, metric(talker, DEFERRED))

    log, a_at_b_end, b_frames, before, after = asyncio.run(run())
    assert b_frames == B_FRAMES and log and log[-1] == ("b", True)  # B spoke to its end ...
    assert ("a", True) not in log and a_at_b_end < AHEAD_FRAMES  # ... while A had frames to go
    assert after > before  # and the talker counted A's waits for B


def test_code2wav_decodes_the_request_with_the_least_buffered_audio_first(full_stages):
    code2wav = full_stages["code2wav"]
    gen = np.random.default_rng(0)

    async def run():
        async with grpc.aio.insecure_channel(code2wav.address) as channel:
            stub = stage_pb2_grpc.Code2WavServiceStub(channel)

            def opener(rid: str, frames: int):
                async def open_call():
                    call = stub.Stream()
                    open_ = stage_pb2.Code2WavOpen(request_id=rid, initial_chunk_frames=1, chunk_frames=1)
                    await call.write(
                        stage_pb2.Code2WavRequest(key=ChunkKey(rid, Stage.TALKER, 0).to_proto(), open=open_)
                    )
                    codes = gen.integers(0, 2048, (16, frames), dtype=np.int64)
                    await call.write(c2w_input(rid, 1, codes, last=True))
                    await call.done_writing()
                    return call

                return open_call

            before = metric(code2wav, DEFERRED)
            # One window per step, one frame per window: a message is one frame's audio.
            result = await _contend(
                opener("edf-a", AHEAD_FRAMES), opener("edf-b", B_FRAMES), LEAD_FRAMES, lambda _chunk: 1
            )
            assert await wait_for(lambda: _idle(code2wav), timeout=30.0)
            return (*result, before, metric(code2wav, DEFERRED))

    log, a_at_b_end, b_chunks, before, after = asyncio.run(run())
    assert b_chunks == B_FRAMES and log and log[-1] == ("b", True)
    assert ("a", True) not in log and a_at_b_end < AHEAD_FRAMES
    assert after > before
