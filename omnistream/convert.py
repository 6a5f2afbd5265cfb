"""Proto <-> domain conversions shared by servicers and clients."""

from __future__ import annotations

import numpy as np

from omnistream.proto.omni.v1 import common_pb2, stage_pb2
from omnistream.qwen3_omni.chunk_plan import (
    DEFAULT_CHUNK_FRAMES,
    DEFAULT_INITIAL_FRAMES,
    DEFAULT_LEFT_CONTEXT_FRAMES,
    ChunkPlan,
)
from omnistream.sampling_params import SamplingParams
from omnistream.stage_chain import StageOpens


def wire_float(value: float) -> float:
    """The number a sender meant by a float32 field: the shortest decimal that is the same float32.

    0.9 travels as 0.89999997...; read back as 0.9, a knob sent over gRPC (client to gateway, or
    gateway to stage) is the very double that REST and the in-process pipeline use, so the same
    request samples the same tokens through every entry point.
    """
    return float(str(np.float32(value)))


def sampling_from_proto(msg: common_pb2.Sampling, prefix: str = "") -> SamplingParams:
    """Proto3 zeros mean "off": top_p 0 -> 1, repetition_penalty 0 -> 1; temperature 0 is greedy."""
    return SamplingParams(
        temperature=wire_float(msg.temperature),
        top_p=wire_float(msg.top_p) if msg.top_p else 1.0,
        top_k=int(msg.top_k),
        repetition_penalty=wire_float(msg.repetition_penalty) if msg.repetition_penalty else 1.0,
        seed=int(msg.seed) if msg.HasField("seed") else None,
    ).validate(prefix)


def sampling_to_proto(params: SamplingParams) -> common_pb2.Sampling:
    msg = common_pb2.Sampling(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        repetition_penalty=params.repetition_penalty,
    )
    if params.seed is not None:
        msg.seed = params.seed
    return msg


def plan_from_fields(initial: int, chunk: int, left_context: int) -> ChunkPlan:
    """Zero means "the default" for each field (proto3 has no presence for scalars)."""
    return ChunkPlan(
        initial or DEFAULT_INITIAL_FRAMES,
        chunk or DEFAULT_CHUNK_FRAMES,
        left_context if left_context else DEFAULT_LEFT_CONTEXT_FRAMES,
    ).validate()


MODE_TO_PROTO = {"async": common_pb2.MODE_ASYNC_CHUNK, "sequential": common_pb2.MODE_SEQUENTIAL}


# The stage chain's edges on the wire (see omnistream/stage_chain.py for the same edges in process).


def thinker_open_proto(
    rid: str, opens: StageOpens, messages: list[dict[str, str]] | None, prompt_ids: list[int] | None
) -> stage_pb2.ThinkerOpen:
    params = opens.thinker
    open_ = stage_pb2.ThinkerOpen(
        request_id=rid,
        max_tokens=params.max_tokens,
        ignore_eos=params.ignore_eos,
        sampling=sampling_to_proto(params.sampling),
    )
    if prompt_ids is not None:
        open_.prompt_ids.extend(prompt_ids)
    else:
        turns = messages or ()
        open_.messages.extend(common_pb2.Message(role=m["role"], content=m["content"]) for m in turns)
    return open_


def talker_open_proto(rid: str, opens: StageOpens) -> stage_pb2.TalkerOpen:
    assert opens.talker is not None and opens.plan is not None
    return stage_pb2.TalkerOpen(
        request_id=rid,
        speaker=opens.talker.speaker,
        max_frames=opens.talker.max_frames,
        sampling=sampling_to_proto(opens.talker.sampling),
        mode=MODE_TO_PROTO[opens.mode],
        initial_chunk_frames=opens.plan.initial,
        chunk_frames=opens.plan.chunk,
        left_context_frames=opens.plan.left_context,
    )


def code2wav_open_proto(rid: str, opens: StageOpens) -> stage_pb2.Code2WavOpen:
    assert opens.plan is not None
    return stage_pb2.Code2WavOpen(
        request_id=rid,
        mode=MODE_TO_PROTO[opens.mode],
        initial_chunk_frames=opens.plan.initial,
        chunk_frames=opens.plan.chunk,
        left_context_frames=opens.plan.left_context,
    )


def talker_input_proto(chunk: stage_pb2.ThinkerChunk) -> stage_pb2.TalkerInput:
    """A thinker chunk as talker input: chunk 0 carries the prompt, the finished one is the last."""
    return stage_pb2.TalkerInput(prompt_ids=chunk.prompt_ids, token_ids=chunk.token_ids, last=chunk.finished)


def codec_input_proto(chunk: stage_pb2.TalkerChunk) -> stage_pb2.CodecInput:
    """A talker chunk as code2wav input: the frames as they are (no re-encoding), the end as `last`."""
    return stage_pb2.CodecInput(codes=chunk.codes, first_frame=chunk.first_frame, last=chunk.finished)
