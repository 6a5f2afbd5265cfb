"""gRPC face of the thinker engine."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from omnistream.chunk_key import ChunkKey, Stage, validate_request_id
from omnistream.convert import sampling_from_proto
from omnistream.errors import InvalidRequest, OmniError
from omnistream.proto.omni.v1 import common_pb2, stage_pb2, stage_pb2_grpc
from omnistream.stage_service import StageServicer
from services.thinker.engine import ThinkerParams

DEFAULT_MAX_TOKENS = 256


class ThinkerServicer(StageServicer, stage_pb2_grpc.ThinkerServiceServicer):
    stage = Stage.THINKER
    input_stage = Stage.GATEWAY

    def _prompt_ids(self, open_: stage_pb2.ThinkerOpen) -> list[int]:
        given = [bool(open_.prompt_ids), bool(open_.prompt_text), bool(open_.messages)]
        if sum(given) != 1:
            raise InvalidRequest("give exactly one of prompt_ids, prompt_text or messages", field="prompt")
        if open_.prompt_ids:
            return list(open_.prompt_ids)
        if open_.prompt_text:
            messages = [{"role": "user", "content": open_.prompt_text}]
        else:
            messages = [{"role": m.role, "content": m.content} for m in open_.messages]
        return self.engine.encode_chat(messages)

    async def Stream(
        self, request_iterator: AsyncIterator[stage_pb2.ThinkerRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[stage_pb2.ThinkerChunk]:
        first = await self._first(request_iterator, context)
        open_ = first.open
        try:
            rid = validate_request_id(open_.request_id)
            self._checker(rid, first.key)
            prompt_ids = self._prompt_ids(open_)
            params = ThinkerParams(
                max_tokens=open_.max_tokens or DEFAULT_MAX_TOKENS,
                ignore_eos=open_.ignore_eos,
                sampling=sampling_from_proto(open_.sampling),
            )
            out = self.engine.add_request(rid, prompt_ids, params)
        except OmniError as exc:
            await self._reject(context, exc)

        async def chunks():
            index = 0
            completion = 0
            while steps := await out.get_batch():
                with self.chunk_cpu("out"):
                    last = steps[-1]
                    completion += sum(len(s.token_ids) for s in steps)
                    chunk = stage_pb2.ThinkerChunk(
                        key=ChunkKey(rid, Stage.THINKER, index).to_proto(),
                        token_ids=[t for s in steps for t in s.token_ids],
                        text_delta="".join(s.text_delta for s in steps),
                        finished=last.finished,
                        finish_reason=last.finish_reason or "",
                    )
                    if index == 0:
                        chunk.prompt_ids.extend(prompt_ids)
                    if last.finished:
                        chunk.usage.CopyFrom(
                            common_pb2.Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion)
                        )
                index += 1
                yield chunk

        async for chunk in self._serve(context, rid, chunks()):
            yield chunk
