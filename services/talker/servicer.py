"""gRPC face of the talker engine: thinker chunks in, codec chunks out."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import torch

from omnistream.engine.api import TalkerStageEngine
from omnistream.engine.stage_sides import TalkerIntake, codec_chunks
from omnistream.models.family import describe_loaded, family_of_loaded
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.errors import InvalidRequest
from omnistream.request.stage_chain import TalkerFeed, TalkerParams
from omnistream.service.metrics import StageMetrics
from omnistream.service.stage_service import Admitted, StageServicer
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.convert import checked_cache_scope, media_layout_from_proto, sampling_from_proto
from omnistream.wire.tensors import from_proto, to_proto

DEFAULT_MAX_FRAMES = 2048
HIDDEN_DTYPES = ("float32", "float64", "bfloat16", "float16")


def checked_rows(msg: stage_pb2.TalkerInput) -> tuple[list[int], torch.Tensor] | None:
    """The multimodal positions and their deep hidden rows, checked before they reach a batch."""
    if not msg.multimodal_positions:
        if msg.HasField("prompt_hidden") and msg.prompt_hidden.shape:
            raise InvalidRequest("prompt_hidden without multimodal_positions", field="prompt_hidden")
        return None
    rows = from_proto(
        msg.prompt_hidden, field="prompt_hidden", max_elements=1 << 26, expect_dtype=HIDDEN_DTYPES
    )
    if rows.dim() != 2 or rows.shape[0] != len(msg.multimodal_positions):
        raise InvalidRequest("prompt_hidden must have one row per multimodal position", field="prompt_hidden")
    if not bool(torch.isfinite(rows).all()):
        raise InvalidRequest("prompt_hidden holds NaN or infinite values", field="prompt_hidden")
    positions = [int(p) for p in msg.multimodal_positions]
    if len(set(positions)) != len(positions):
        raise InvalidRequest("multimodal_positions repeat a position", field="multimodal_positions")
    return positions, rows


class TalkerServicer(StageServicer):
    stage = Stage.TALKER
    input_stage = Stage.THINKER
    service_name = "TalkerService"
    request_type = stage_pb2.TalkerRequest
    response_type = stage_pb2.TalkerChunk
    engine: TalkerStageEngine

    def __init__(self, engine: TalkerStageEngine, metrics: StageMetrics, **identity: Any) -> None:
        super().__init__(engine, metrics, **identity)
        self.family = family_of_loaded(engine.config)  # the edges' model-specific pieces

    def _describe(self, info: stage_pb2.StageInfo) -> None:
        facts = describe_loaded(self.engine.config)
        info.family = facts.family
        info.voices.extend(facts.voices)
        info.default_voice = self.engine.default_speaker  # what an empty TalkerOpen.speaker gets
        info.codebooks = facts.talker_codebooks
        info.frames_per_second = facts.frames_per_second
        info.limits.max_model_len = self.engine.max_model_len
        info.limits.max_frames = self.engine.max_model_len  # TalkerParams.max_frames is checked against it

    def multimodal_rows(self, msg: stage_pb2.TalkerInput) -> Mapping[int, Any] | None:
        checked = checked_rows(msg)
        return None if checked is None else self.family.talker_rows(*checked)

    async def _open(self, first: stage_pb2.TalkerRequest) -> Admitted:
        open_ = first.open
        rid, checker, mode, plan = self._open_streaming(open_, first.key)
        params = TalkerParams(
            speaker=open_.speaker or self.engine.default_speaker,
            max_frames=open_.max_frames or DEFAULT_MAX_FRAMES,
            sampling=sampling_from_proto(open_.sampling, "talker_"),
            ignore_eos=open_.ignore_eos,
            cache_scope=checked_cache_scope(open_.cache_scope),
        )
        out = self.engine.add_request(rid, params)
        intake = TalkerIntake(self.engine, rid, mode)

        def handle(msg: stage_pb2.TalkerInput) -> bool:
            # Rows are checked when they arrive (also when held), and decoded once.
            rows = self.multimodal_rows(msg)
            layout = media_layout_from_proto(msg.media_layout) if msg.HasField("media_layout") else None
            intake.push(TalkerFeed(list(msg.token_ids), msg.last, list(msg.prompt_ids) or None, rows, layout))
            return msg.last

        async def chunks() -> AsyncIterator[stage_pb2.TalkerChunk]:
            index = 0
            async for chunk in codec_chunks(out, self.family.frame_shipper(plan)):
                with self.chunk_cpu("out"):
                    message = stage_pb2.TalkerChunk(
                        key=ChunkKey(rid, Stage.TALKER, index).to_proto(),
                        codes=to_proto(chunk.codes),
                        first_frame=chunk.first_frame,
                        finished=chunk.finished,
                        finish_reason=chunk.finish_reason,
                    )
                yield message
                index += 1

        return Admitted(rid, out, chunks(), checker, handle)
