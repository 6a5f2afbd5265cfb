"""gRPC face of the thinker engine."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from omnistream.engine.api import ThinkerStageEngine
from omnistream.engine.stage_sides import thinker_pieces
from omnistream.engine.token_memo import ScopeTokenMemos
from omnistream.models.family import describe_loaded
from omnistream.proto.omni.v1 import common_pb2, stage_pb2
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import has_media
from omnistream.request.spoken import TokenPieces
from omnistream.request.stage_chain import ThinkerParams
from omnistream.service.metrics import StageMetrics
from omnistream.service.scope_audio import ScopeAudio, ScopeAudioCollector
from omnistream.service.stage_service import Admitted, StageServicer
from omnistream.wire.chunk_key import ChunkKey, Stage, validate_request_id
from omnistream.wire.convert import (
    checked_cache_scope,
    media_layout_to_proto,
    sampling_from_proto,
    structured_output_from_proto,
    tools_from_proto,
)
from omnistream.wire.messages import messages_from_proto
from omnistream.wire.tensors import fill_tensor

DEFAULT_MAX_TOKENS = 256
# Tokenizing and media preprocessing (the processor's feature extraction) run here, off the event
# loop (tokenizer and numpy release the GIL), so one long prompt cannot stall health checks or other
# streams; the pool bounds how many run at once.
TOKENIZER_THREADS = 2


class ThinkerServicer(StageServicer):
    stage = Stage.THINKER
    input_stage = Stage.GATEWAY
    service_name = "ThinkerService"
    request_type = stage_pb2.ThinkerRequest
    response_type = stage_pb2.ThinkerChunk
    drain_input = False  # nothing follows the open; the output's end is the stream's end
    engine: ThinkerStageEngine

    def __init__(self, engine: ThinkerStageEngine, metrics: StageMetrics, **identity: Any) -> None:
        super().__init__(engine, metrics, **identity)
        self._tokenizer_pool = ThreadPoolExecutor(TOKENIZER_THREADS, thread_name_prefix="tokenize")
        # What the talker speaks of each answer (ThinkerChunk.spoken): never a tool call.
        self._pieces = TokenPieces(engine.tokenizer)
        # Each cache scope's audio, for its later turns to name by digest (scope_audio.py).
        self.scope_audio = ScopeAudio()
        metrics.registry.register(ScopeAudioCollector(self.scope_audio))
        # Each cache scope's last prompt text, so its next turn tokenizes only what is new.
        self.token_memos = ScopeTokenMemos()

    def release_scope(self, scope: bytes) -> None:
        self.scope_audio.release(scope)
        self.token_memos.release(scope)

    def _describe(self, info: stage_pb2.StageInfo) -> None:
        facts = describe_loaded(self.engine.config)
        info.family = facts.family
        # An engine may take less than the model does (the vLLM thinker: text only).
        info.input_modalities.extend(getattr(self.engine, "input_modalities", facts.input_modalities))
        info.limits.max_model_len = self.engine.max_model_len

    async def _prompt(self, open_: stage_pb2.ThinkerOpen) -> tuple[list[int], Any]:
        """The prompt ids and, for a chat with media, its processed media (else None)."""
        given = [bool(open_.prompt_ids), bool(open_.prompt_text), bool(open_.messages)]
        if sum(given) != 1:
            raise InvalidRequest("give exactly one of prompt_ids, prompt_text or messages", field="prompt")
        if open_.prompt_ids:
            return list(open_.prompt_ids), None
        if open_.prompt_text:
            messages = [{"role": "user", "content": open_.prompt_text}]
        else:
            messages = messages_from_proto(open_.messages)
        tools = tools_from_proto(open_.tools)
        loop = asyncio.get_running_loop()
        if has_media(messages):
            scope = checked_cache_scope(open_.cache_scope)

            def prepare() -> Any:
                if open_.encode_only:  # a turn still spoken: nothing of it is the scope's yet
                    return self.engine.prepare_media(messages, open_.use_audio_in_video, tools, ahead=True)
                # Digests become the scope's kept audio, and its new audio is kept (scope_audio.py).
                resolved = self.scope_audio.resolve(messages, scope)
                memo = self.token_memos.get(scope)
                return self.engine.prepare_media(resolved, open_.use_audio_in_video, tools, memo=memo)

            media = await loop.run_in_executor(self._tokenizer_pool, prepare)
            return media.prompt_ids, media
        memo = self.token_memos.get(checked_cache_scope(open_.cache_scope))
        encode = functools.partial(self.engine.encode_chat, messages, tools, memo)
        return await loop.run_in_executor(self._tokenizer_pool, encode), None

    async def _open(self, first: stage_pb2.ThinkerRequest) -> Admitted:
        open_ = first.open
        rid = validate_request_id(open_.request_id)
        checker = self._checker(rid, first.key)
        params = ThinkerParams(
            max_tokens=open_.max_tokens or DEFAULT_MAX_TOKENS,
            ignore_eos=open_.ignore_eos,
            sampling=sampling_from_proto(open_.sampling),
            assistant_text=open_.assistant_text or None,
            cache_scope=checked_cache_scope(open_.cache_scope),
            structured_output=(
                structured_output_from_proto(open_.structured_output)
                if open_.HasField("structured_output")
                else None
            ),
            background=open_.background,
            encode_only=open_.encode_only,
            answer_ids=tuple(open_.answer_ids),
        )
        prompt_ids, media = await self._prompt(open_)
        spoken = grammar = None
        if params.assistant_text is not None:
            loop = asyncio.get_running_loop()
            encode = functools.partial(self.engine.encode_assistant_text, params.assistant_text)
            spoken = await loop.run_in_executor(self._tokenizer_pool, encode)
        elif params.structured_output is not None:  # compiled off the loop, within the engine's bound
            grammar = await self.engine.compile_grammar(params.structured_output)
        out = self.engine.add_request(rid, prompt_ids, params, media=media, spoken=spoken, grammar=grammar)
        speech = self._pieces.filter(params.structured_output)

        async def chunks() -> AsyncIterator[stage_pb2.ThinkerChunk]:
            index = 0
            completion = 0
            cached = 0  # prompt tokens the prefix cache served (chunk 0 says)
            async for piece in thinker_pieces(out, speech, prompt_ids, params.answer_ids):
                with self.chunk_cpu("out"):
                    completion += len(piece.token_ids)
                    chunk = stage_pb2.ThinkerChunk(
                        key=ChunkKey(rid, Stage.THINKER, index).to_proto(),
                        token_ids=piece.token_ids,
                        text_delta=piece.text_delta,
                        finished=piece.finished,
                        finish_reason=piece.finish_reason,
                    )
                    chunk.spoken.SetInParent()  # set even when empty: nothing of it is spoken
                    chunk.spoken.token_ids.extend(piece.spoken or ())
                    if piece.prompt_ids is not None:
                        chunk.prompt_ids.extend(piece.prompt_ids)
                        chunk.cached_tokens = cached = piece.cached_tokens
                        if piece.multimodal_positions:
                            fill_tensor(chunk.prompt_hidden, piece.prompt_hidden)
                            chunk.multimodal_positions.extend(piece.multimodal_positions)
                        if piece.media_layout is not None and piece.media_layout.has_vision:
                            chunk.media_layout.CopyFrom(media_layout_to_proto(piece.media_layout))
                    if piece.finished:
                        usage = common_pb2.Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion)
                        usage.cached_tokens = cached
                        chunk.usage.CopyFrom(usage)
                index += 1
                yield chunk

        return Admitted(rid, out, chunks(), checker)
