"""The links of a chain whose stages are gRPC services: one bidi stream per stage.

Each link writes its stage's messages and reads its chunks, naming its stage in any failure
(stage_errors.py). What goes from one stage to the next is forwarded as the stage sent it (deep rows
and codec frames are not decoded here); the gateway decodes only what it sends its client (audio, and
codec frames for tools that ask for them). The hand-off rules are the chain's (omnistream/chain/run.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np

from gateway.serving.stage_errors import calls_to, stage_error
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.errors import InternalError
from omnistream.request.generation import GenerationRequest
from omnistream.request.stage_chain import StageOpens
from omnistream.request.stage_outputs import AudioOut, CodecOut, ThinkerOut
from omnistream.service.server import OPEN_ACCEPTED, OPEN_METADATA_KEY
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.convert import (
    code2wav_open_proto,
    codec_input_proto,
    talker_chunk_from,
    talker_input_proto,
    talker_open_proto,
    thinker_open_proto,
)
from omnistream.wire.messages import Referrer
from omnistream.wire.tensors import numpy_from_proto

# A stage's initial metadata without the acceptance mark: its call is checked this often for the
# status of a refusal before it counts as accepted (50 ms, once per call, only for a stage that
# predates the mark).
UNMARKED_OPEN_CHECKS = 10
UNMARKED_OPEN_CHECK_S = 0.005

# What the call of each stage's stream is, to the links (grpc's aio stream call).
Call = Any


async def accepted(stage: str, call: Call) -> None:
    """Wait for the stage to accept its open message (initial metadata that says so) or to refuse it
    (a status: gRPC answers the wait for initial metadata with an empty set first)."""
    metadata = await call.initial_metadata()
    if metadata.get(OPEN_METADATA_KEY) == OPEN_ACCEPTED:
        return
    # A refusal (its status follows the empty initial metadata at once), or a stage from before the
    # mark (omnistream 0.1 during a rollout), which accepts without saying so.
    for _ in range(UNMARKED_OPEN_CHECKS):
        if call.done():
            raise stage_error(stage, await call.code(), await call.details(), await call.trailing_metadata())
        await asyncio.sleep(UNMARKED_OPEN_CHECK_S)


class GrpcThinker:
    def __init__(
        self,
        call: Call,
        request_id: str,
        request: GenerationRequest,
        opens: StageOpens,
        refer_audio: Referrer | None = None,
    ) -> None:
        self.call, self.request_id, self.request, self.opens = call, request_id, request, opens
        self._refer_audio = refer_audio

    async def open(self) -> None:
        r = self.request
        # The open is built in its request: its media are not copied into it (wire/tensors.py).
        request = stage_pb2.ThinkerRequest(key=ChunkKey(self.request_id, Stage.GATEWAY, 0).to_proto())
        thinker_open_proto(
            self.request_id,
            self.opens,
            r.messages,
            r.prompt_ids,
            r.tools,
            self._refer_audio,
            into=request.open,
        )
        async with calls_to("thinker", self.call, moot_once_ok=False):
            await self.call.write(request)
            await self.call.done_writing()

    async def outputs(self) -> AsyncIterator[ThinkerOut]:
        async with calls_to("thinker", self.call, moot_once_ok=False):
            async for chunk in self.call:
                yield ThinkerOut(
                    token_ids=list(chunk.token_ids),
                    text_delta=chunk.text_delta,
                    finished=chunk.finished,
                    finish_reason=chunk.finish_reason,
                    prompt_ids=list(chunk.prompt_ids) or None,
                    cached_tokens=chunk.cached_tokens,
                    wire=chunk,
                )

    def close(self) -> None:
        self.call.cancel()


class GrpcTalker:
    def __init__(
        self, call: Call, request_id: str, opens: StageOpens, with_codes: bool = False, start_frame: int = 0
    ) -> None:
        """`start_frame`: a talker resumed on a sibling regenerates from frame 0; the frames before
        this one went on already, so its outputs begin here (omnistream/chain/resume.py)."""
        self.call, self.request_id, self.opens, self.with_codes = call, request_id, opens, with_codes
        self.start_frame = start_frame
        self._index = 1  # chunk 0 is the open message

    async def open(self) -> None:
        key = ChunkKey(self.request_id, Stage.THINKER, 0).to_proto()
        async with calls_to("talker", self.call, moot_once_ok=False):
            open_ = talker_open_proto(self.request_id, self.opens)
            await self.call.write(stage_pb2.TalkerRequest(key=key, open=open_))
            await accepted("talker", self.call)

    async def feed(self, piece: ThinkerOut) -> None:
        # A failed write is moot: the talker's own stream reports how it ended.
        with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
            key = ChunkKey(self.request_id, Stage.THINKER, self._index).to_proto()
            await self.call.write(stage_pb2.TalkerRequest(key=key, input=talker_input_proto(piece.wire)))
        self._index += 1

    async def end_input(self) -> None:
        with contextlib.suppress(asyncio.InvalidStateError, grpc.aio.AioRpcError):
            await self.call.done_writing()

    async def outputs(self) -> AsyncIterator[CodecOut]:
        async with calls_to("talker", self.call, moot_once_ok=False):
            async for wire in self.call:
                chunk = talker_chunk_from(wire, self.start_frame)
                frames = chunk.codes.shape[1] if len(chunk.codes.shape) == 2 else 0
                if not frames and not chunk.finished:
                    continue  # all of it went on already (a talker sends no other empty chunk)
                codes = numpy_from_proto(chunk.codes, field="codes") if self.with_codes and frames else None
                yield CodecOut(chunk.first_frame, frames, chunk.finished, chunk.finish_reason, codes, chunk)

    def close(self) -> None:
        self.call.cancel()


class GrpcCode2Wav:
    def __init__(self, call: Call, request_id: str, opens: StageOpens) -> None:
        self.call, self.request_id, self.opens = call, request_id, opens
        self._index = 1  # chunk 0 is the open message

    async def open(self) -> None:
        key = ChunkKey(self.request_id, Stage.TALKER, 0).to_proto()
        async with calls_to("code2wav", self.call, moot_once_ok=False):
            open_ = code2wav_open_proto(self.request_id, self.opens)
            await self.call.write(stage_pb2.Code2WavRequest(key=key, open=open_))
            await accepted("code2wav", self.call)

    async def feed(self, piece: CodecOut) -> None:
        key = ChunkKey(self.request_id, Stage.TALKER, self._index).to_proto()
        async with calls_to("code2wav", self.call):
            await self.call.write(stage_pb2.Code2WavRequest(key=key, input=codec_input_proto(piece.wire)))
        self._index += 1

    async def end_input(self) -> None:
        async with calls_to("code2wav", self.call):
            await self.call.done_writing()

    async def outputs(self) -> AsyncIterator[AudioOut]:
        async with calls_to("code2wav", self.call, moot_once_ok=False):
            async for chunk in self.call:
                audio = numpy_from_proto(chunk.audio, field="audio")
                if audio.size and not chunk.sample_rate:
                    raise InternalError("code2wav sent audio without its sample rate")
                samples = np.asarray(audio, dtype=np.float32)
                yield AudioOut(samples, int(chunk.first_sample), chunk.sample_rate, chunk.finished)

    def close(self) -> None:
        self.call.cancel()
