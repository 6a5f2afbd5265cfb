"""gRPC face of the Code2Wav engine: codec chunks in, audio chunks out."""

from __future__ import annotations

from collections.abc import AsyncIterator

from omnistream.engine.api import Code2WavStageEngine
from omnistream.engine.stage_sides import CodecIntake, audio_pieces
from omnistream.models.family import describe_loaded
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.errors import InvalidRequest, SequenceError
from omnistream.request.stage_chain import CodecFeed
from omnistream.service.stage_service import Admitted, StageServicer
from omnistream.wire.chunk_key import ChunkKey, Stage
from omnistream.wire.tensors import fill_tensor, from_proto

MAX_FRAMES_PER_CHUNK = 4096


class Code2WavServicer(StageServicer):
    stage = Stage.CODE2WAV
    input_stage = Stage.TALKER
    service_name = "Code2WavService"
    request_type = stage_pb2.Code2WavRequest
    response_type = stage_pb2.AudioChunk
    engine: Code2WavStageEngine

    def _describe(self, info: stage_pb2.StageInfo) -> None:
        facts = describe_loaded(self.engine.config)
        info.family = facts.family
        info.sample_rate = facts.sample_rate
        info.codebooks = facts.codebooks
        info.frames_per_second = facts.frames_per_second
        info.limits.max_frames = self.engine.max_frames
        info.limits.max_step_frames = self.engine.max_step_frames or 0

    async def _open(self, first: stage_pb2.Code2WavRequest) -> Admitted:
        rid, checker, mode, plan = self._open_streaming(first.open, first.key)
        out = self.engine.add_request(rid, plan)
        received = 0
        intake = CodecIntake(self.engine, rid, mode)

        def handle(msg: stage_pb2.CodecInput) -> bool:
            nonlocal received
            codes = from_proto(
                msg.codes,
                field="codes",
                expect_dtype=("int64", "int32"),
                max_elements=self.engine.num_quantizers * MAX_FRAMES_PER_CHUNK,
            )
            if codes.numel() and codes.dim() != 2:
                raise InvalidRequest("codes must be [codebooks, frames]", field="codes")
            frames = codes.shape[1] if codes.dim() == 2 else 0
            if msg.first_frame != received:
                raise SequenceError(
                    f"chunk for request {rid!r} starts at frame {msg.first_frame}, expected frame {received}",
                    field="first_frame",
                )
            received += frames
            intake.push(CodecFeed(codes if frames else None, msg.first_frame, msg.last))
            return msg.last

        sample_rate = self.info().sample_rate

        async def chunks() -> AsyncIterator[stage_pb2.AudioChunk]:
            index = 0
            async for piece in audio_pieces(out, sample_rate):
                with self.chunk_cpu("out"):
                    message = stage_pb2.AudioChunk(
                        key=ChunkKey(rid, Stage.CODE2WAV, index).to_proto(),
                        sample_rate=sample_rate,
                        first_sample=piece.first_sample,
                        finished=piece.finished,
                    )
                    fill_tensor(message.audio, piece.audio)  # in place: not copied into the chunk
                yield message
                index += 1

        return Admitted(rid, out, chunks(), checker, handle)
