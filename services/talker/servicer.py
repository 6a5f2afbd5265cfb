"""gRPC face of the talker engine: thinker chunks in, codec chunks out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from omnistream.chunk_key import ChunkKey, Stage
from omnistream.convert import sampling_from_proto
from omnistream.errors import InvalidRequest, OmniError
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.qwen3_omni.codec_chunks import FrameShipper
from omnistream.stage_service import StageServicer
from omnistream.tensors import from_proto, to_proto
from services.talker.engine import TalkerParams

DEFAULT_MAX_FRAMES = 2048


class TalkerServicer(StageServicer, stage_pb2_grpc.TalkerServiceServicer):
    stage = Stage.TALKER
    input_stage = Stage.THINKER

    async def Stream(
        self, request_iterator: AsyncIterator[stage_pb2.TalkerRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[stage_pb2.TalkerChunk]:
        first = await self._first(request_iterator, context)
        open_ = first.open
        try:
            rid, checker, mode, plan = self._open_streaming(open_, first.key)
            params = TalkerParams(
                speaker=open_.speaker or "ethan",
                max_frames=open_.max_frames or DEFAULT_MAX_FRAMES,
                sampling=sampling_from_proto(open_.sampling, "talker_"),
            )
            out = self.engine.add_request(rid, params)
        except OmniError as exc:
            await self._reject(context, exc)

        held: list[stage_pb2.TalkerInput] = []  # sequential mode: input is released at the end

        def feed(msg: stage_pb2.TalkerInput) -> None:
            hidden = None
            if msg.multimodal_positions:
                rows = from_proto(msg.prompt_hidden, field="prompt_hidden", max_elements=1 << 26)
                if rows.dim() != 2 or rows.shape[0] != len(msg.multimodal_positions):
                    raise InvalidRequest(
                        "prompt_hidden must have one row per multimodal position", field="prompt_hidden"
                    )
                hidden = {int(p): rows[i] for i, p in enumerate(msg.multimodal_positions)}
            self.engine.feed(
                rid,
                list(msg.token_ids),
                msg.last,
                prompt_ids=list(msg.prompt_ids) or None,
                multimodal_hidden=hidden,
            )

        def handle(msg: stage_pb2.TalkerInput) -> bool:
            if mode == "sequential":
                held.append(msg)
                if msg.last:
                    prompt = [p for m in held for p in m.prompt_ids]
                    merged = stage_pb2.TalkerInput(
                        prompt_ids=prompt, token_ids=[t for m in held for t in m.token_ids], last=True
                    )
                    for m in held:
                        if m.multimodal_positions:
                            merged.prompt_hidden.CopyFrom(m.prompt_hidden)
                            merged.multimodal_positions.extend(m.multimodal_positions)
                    feed(merged)
                return msg.last
            feed(msg)
            return msg.last

        async def chunks():
            index = 0
            shipper = FrameShipper(plan)
            while steps := await out.get_batch():
                finished = False
                reason = ""
                for step in steps:
                    if step.codes is not None:
                        shipper.frames.append(step.codes)
                    finished = finished or step.finished
                    reason = step.finish_reason or reason
                if not shipper.due(finished):
                    continue
                with self.chunk_cpu("out"):
                    first_frame, codes = shipper.take()
                    message = stage_pb2.TalkerChunk(
                        key=ChunkKey(rid, Stage.TALKER, index).to_proto(),
                        codes=to_proto(codes),
                        first_frame=first_frame,
                        finished=finished,
                        finish_reason=reason,
                    )
                yield message
                index += 1

        def pump(output_done: asyncio.Event):
            return self._pump(request_iterator, checker, out, handle, output_done)

        async for chunk in self._serve(context, rid, chunks(), pump):
            yield chunk
