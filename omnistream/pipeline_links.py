"""The links of a chain whose stages are engines in this process (the pipeline).

Each does what the stage's servicer does around its engine (the same stage sides,
omnistream/engine/stage_sides.py), without the wire: the pipeline and the services run the same
hand-offs, so they produce identical tokens, codes and audio and their timings compare fairly.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from omnistream.engine.api import Code2WavStageEngine, TalkerStageEngine, ThinkerStageEngine
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.stage_sides import (
    CodecIntake,
    TalkerIntake,
    audio_pieces,
    codec_chunks,
    thinker_pieces,
)
from omnistream.models.family import ModelFamily
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import has_media
from omnistream.request.spoken import TokenPieces
from omnistream.request.stage_chain import CodecFeed, StageOpens, TalkerFeed, TalkerParams
from omnistream.request.stage_outputs import AudioOut, CodecOut, ThinkerOut


class LocalThinker:
    def __init__(
        self,
        engine: ThinkerStageEngine,
        request_id: str,
        request: GenerationRequest,
        opens: StageOpens,
        pieces: TokenPieces,
    ) -> None:
        self.engine, self.request_id, self.request, self.opens = engine, request_id, request, opens
        self._speech = pieces.filter(request.structured_output)
        self._out: OutputStream[Any] | None = None
        self._prompt_ids: list[int] = []

    async def open(self) -> None:
        """The prompt tokenized (or its media processed) and the grammar compiled, off the loop, as
        the thinker service does; then the engine takes the request."""
        request, params = self.request, self.opens.thinker
        prompt_ids = request.prompt_ids
        media = None
        messages, tools = request.messages or [], request.tools
        if prompt_ids is None and has_media(request.messages):
            media = await asyncio.to_thread(
                self.engine.prepare_media,
                messages,
                params.use_audio_in_video,
                tools,
                ahead=params.encode_only,
            )
            prompt_ids = media.prompt_ids
        elif prompt_ids is None:
            prompt_ids = await asyncio.to_thread(self.engine.encode_chat, messages, tools)
        spoken = grammar = None
        if params.assistant_text is not None:
            spoken = await asyncio.to_thread(self.engine.encode_assistant_text, params.assistant_text)
        elif params.structured_output is not None:
            grammar = await self.engine.compile_grammar(params.structured_output)
        self._prompt_ids = list(prompt_ids)
        self._out = self.engine.add_request(
            self.request_id, self._prompt_ids, params, media=media, spoken=spoken, grammar=grammar
        )

    async def outputs(self) -> AsyncIterator[ThinkerOut]:
        assert self._out is not None, "open() first"
        async for piece in thinker_pieces(
            self._out, self._speech, self._prompt_ids, self.opens.thinker.answer_ids
        ):
            yield piece

    def close(self) -> None:
        self.engine.abort(self.request_id)


class LocalTalker:
    def __init__(
        self,
        engine: TalkerStageEngine,
        family: ModelFamily,
        request_id: str,
        params: TalkerParams,
        plan: ChunkPlan,
        mode: str,
        lookahead: int,
        start_frame: int = 0,
    ) -> None:
        """`start_frame`: its outputs begin there (a talker that regenerates what went on already:
        omnistream/chain/resume.py)."""
        self.engine, self.family, self.request_id = engine, family, request_id
        self._params, self._plan, self._lookahead = params, plan, lookahead
        self.start_frame = start_frame
        self._intake = TalkerIntake(engine, request_id, mode)
        self._out: OutputStream[Any] | None = None

    async def open(self) -> None:
        self._out = self.engine.add_request(self.request_id, self._params)

    async def feed(self, piece: ThinkerOut) -> None:
        rows = None
        if piece.multimodal_positions:
            rows = self.family.talker_rows(piece.multimodal_positions, piece.prompt_hidden)
        said = piece.token_ids if piece.spoken is None else piece.spoken
        feed = TalkerFeed(said, piece.finished, piece.prompt_ids, rows, piece.media_layout)
        try:
            self._intake.push(feed)
        except InvalidRequest:
            if self.engine.has_request(self.request_id):
                raise
            # The talker finished before the chain saw its end: the input is moot (as a write to
            # a finished stream is); a talker that failed reports that on its own output.

    async def end_input(self) -> None:
        """Nothing to send: the thinker's last piece said `last`, or the talker finished first."""

    async def outputs(self) -> AsyncIterator[CodecOut]:
        assert self._out is not None, "open() first"
        shipper = self.family.frame_shipper(self._plan, self._lookahead)
        async for chunk in codec_chunks(self._out, shipper):
            skip = min(max(self.start_frame - chunk.first_frame, 0), chunk.frames)
            if skip:
                codes = chunk.codes[:, skip:]
                chunk = CodecOut(
                    chunk.first_frame + skip, int(codes.shape[1]), chunk.finished, chunk.finish_reason, codes
                )
            if chunk.frames or chunk.finished:
                yield chunk

    def close(self) -> None:
        self.engine.abort(self.request_id)


class LocalCode2Wav:
    def __init__(
        self, engine: Code2WavStageEngine, request_id: str, plan: ChunkPlan, mode: str, sample_rate: int
    ) -> None:
        self.engine, self.request_id, self._plan, self._sample_rate = engine, request_id, plan, sample_rate
        self._intake = CodecIntake(engine, request_id, mode)
        self._out: OutputStream[Any] | None = None

    async def open(self) -> None:
        self._out = self.engine.add_request(self.request_id, self._plan)

    async def feed(self, piece: CodecOut) -> None:
        codes = piece.codes if piece.frames else None
        self._intake.push(CodecFeed(codes, piece.first_frame, piece.finished))

    async def end_input(self) -> None:
        """Nothing to send: the talker's last chunk said `last`."""

    async def outputs(self) -> AsyncIterator[AudioOut]:
        assert self._out is not None, "open() first"
        async for piece in audio_pieces(self._out, self._sample_rate):
            yield piece

    def close(self) -> None:
        self.engine.abort(self.request_id)
