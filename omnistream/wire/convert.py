"""Proto <-> domain conversions shared by servicers and clients."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, overload

import numpy as np

from omnistream.proto.omni.v1 import common_pb2, stage_pb2
from omnistream.request.chunk_plan import (
    DEFAULT_CHUNK_FRAMES,
    DEFAULT_INITIAL_FRAMES,
    DEFAULT_LEFT_CONTEXT_FRAMES,
    SCHEDULE_FIXED,
    SCHEDULE_GROW,
    ChunkPlan,
)
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import MediaLayout
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.stage_chain import StageOpens
from omnistream.request.structured import KINDS, MAX_SPEC_BYTES, StructuredOutput
from omnistream.wire import tensors
from omnistream.wire.messages import Referrer, fill_message


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


SCHEDULE_TO_PROTO = {
    SCHEDULE_FIXED: stage_pb2.CHUNK_SCHEDULE_FIXED,
    SCHEDULE_GROW: stage_pb2.CHUNK_SCHEDULE_GROWING,
}
SCHEDULE_FROM_PROTO: dict[int, str] = {number: name for name, number in SCHEDULE_TO_PROTO.items()}


@overload
def schedule_from_proto(value: int, unspecified: str, field: str = ...) -> str: ...
@overload
def schedule_from_proto(value: int, unspecified: None, field: str = ...) -> str | None: ...
def schedule_from_proto(value: int, unspecified: str | None, field: str = "chunk_schedule") -> str | None:
    """A ChunkSchedule number as the plan's name; UNSPECIFIED is `unspecified` (which differs by API:
    a stage reads an older gateway's plan as fixed, the public API reads "not given")."""
    if value == stage_pb2.CHUNK_SCHEDULE_UNSPECIFIED:
        return unspecified
    name = SCHEDULE_FROM_PROTO.get(value)
    if name is None:
        raise InvalidRequest(f"unknown chunk schedule {value}", field=field)
    return name


def plan_from_fields(
    initial: int, chunk: int, left_context: int, schedule: int = stage_pb2.CHUNK_SCHEDULE_UNSPECIFIED
) -> ChunkPlan:
    """Zero means "the default" for each frame count (proto3 has no presence for scalars); an
    unspecified schedule means fixed, what an older gateway (which never sent one) asked for."""
    return ChunkPlan(
        initial or DEFAULT_INITIAL_FRAMES,
        chunk or DEFAULT_CHUNK_FRAMES,
        left_context if left_context else DEFAULT_LEFT_CONTEXT_FRAMES,
        schedule_from_proto(schedule, SCHEDULE_FIXED),
    ).validate()


MODE_TO_PROTO = {"async": common_pb2.MODE_ASYNC_CHUNK, "sequential": common_pb2.MODE_SEQUENTIAL}


# The stage chain's edges on the wire (see omnistream/request/stage_chain.py for the same edges in process).


def tools_to_proto(tools: Sequence[Mapping[str, Any]] | None) -> str:
    """ThinkerOpen.tools: the tools as one JSON text ("" for none)."""
    return json.dumps(list(tools), ensure_ascii=False) if tools else ""


def tools_from_proto(text: str) -> list[dict[str, Any]] | None:
    """ThinkerOpen.tools back as the tools list (None when empty): a JSON array of objects, each
    with a `function` object naming it; anything else is the sender's bug."""
    if not text:
        return None
    try:
        tools = json.loads(text)
    except ValueError as exc:
        raise InvalidRequest(f"tools is not JSON: {exc}", field="tools") from None
    if not isinstance(tools, list) or not all(
        isinstance(t, dict)
        and isinstance(t.get("function"), dict)
        and isinstance(t["function"].get("name"), str)
        for t in tools
    ):
        raise InvalidRequest("tools must be a JSON array of function tool objects", field="tools")
    return tools or None


MAX_CACHE_SCOPE_BYTES = 64


def checked_cache_scope(scope: bytes) -> bytes:
    """A prefix cache scope from the wire (ThinkerOpen/TalkerOpen.cache_scope, ReleaseCache)."""
    if len(scope) > MAX_CACHE_SCOPE_BYTES:
        raise InvalidRequest(
            f"cache_scope is {len(scope)} bytes; at most {MAX_CACHE_SCOPE_BYTES}", field="cache_scope"
        )
    return bytes(scope)


def structured_output_proto(structured: StructuredOutput) -> common_pb2.StructuredOutput:
    return common_pb2.StructuredOutput(kind=structured.kind, spec=structured.spec)


def structured_output_from_proto(msg: common_pb2.StructuredOutput) -> StructuredOutput:
    """A grammar from the wire, checked before anything compiles it: an unknown kind is the
    sender's bug (named by the stage field), a spec too large or missing the client's (named by its
    param: see `StructuredOutput.param`). A json_object's spec is not read."""
    if msg.kind not in KINDS:
        raise InvalidRequest(
            f"structured_output.kind {msg.kind!r} is not one of {', '.join(KINDS)}",
            field="structured_output.kind",
        )
    structured = StructuredOutput(msg.kind, msg.spec)
    size = len(msg.spec.encode("utf-8", "surrogatepass"))
    if size > MAX_SPEC_BYTES:
        raise InvalidRequest(
            f"the output grammar is {size} bytes, over the limit of {MAX_SPEC_BYTES}", field=structured.param
        )
    if msg.kind != "json_object" and not msg.spec.strip():
        raise InvalidRequest(f"a {msg.kind} grammar needs its spec", field=structured.param)
    return structured


def thinker_open_proto(
    rid: str,
    opens: StageOpens,
    messages: Sequence[Mapping[str, Any]] | None,
    prompt_ids: list[int] | None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    refer: Referrer | None = None,
    into: stage_pb2.ThinkerOpen | None = None,
) -> stage_pb2.ThinkerOpen:
    """The thinker's open (written `into` the request's field, where given: its media are built
    in place, not copied into it); media parts (decoded arrays, omnistream/request/media.py)
    travel as tensors, an audio part as its digest where `refer` gives one (it must know the
    thinker keeps it)."""
    params = opens.thinker
    open_ = into if into is not None else stage_pb2.ThinkerOpen()
    open_.request_id = rid
    open_.max_tokens = params.max_tokens
    open_.ignore_eos = params.ignore_eos
    open_.sampling.CopyFrom(sampling_to_proto(params.sampling))
    open_.use_audio_in_video = params.use_audio_in_video
    open_.assistant_text = params.assistant_text or ""
    open_.cache_scope = params.cache_scope
    open_.background = params.background
    open_.encode_only = params.encode_only
    del open_.answer_ids[:]
    open_.answer_ids.extend(params.answer_ids)
    if params.structured_output is not None:
        open_.structured_output.CopyFrom(structured_output_proto(params.structured_output))
    if prompt_ids is not None:
        open_.prompt_ids.extend(prompt_ids)
    else:
        for message in messages or ():
            fill_message(open_.messages.add(), message, refer)
        open_.tools = tools_to_proto(tools)
    return open_


def media_layout_to_proto(layout: MediaLayout) -> common_pb2.MediaLayout:
    return common_pb2.MediaLayout(
        image_grid_thw=[n for g in layout.image_grid_thw for n in g],
        video_grid_thw=[n for g in layout.video_grid_thw for n in g],
        video_second_per_grid=layout.video_second_per_grid,
        audio_feature_lengths=layout.audio_feature_lengths,
    )


def media_layout_from_proto(msg: common_pb2.MediaLayout) -> MediaLayout | None:
    """None when empty; a malformed layout is refused before it reaches the talker's batch."""

    def triples(values: Sequence[int], name: str) -> tuple[tuple[int, int, int], ...]:
        if len(values) % 3 or any(v <= 0 for v in values):
            raise InvalidRequest(
                f"media_layout.{name} must be positive [t, h, w] triples", field="media_layout"
            )
        return tuple((values[i], values[i + 1], values[i + 2]) for i in range(0, len(values), 3))

    layout = MediaLayout(
        image_grid_thw=triples(msg.image_grid_thw, "image_grid_thw"),
        video_grid_thw=triples(msg.video_grid_thw, "video_grid_thw"),
        video_second_per_grid=tuple(msg.video_second_per_grid),
        audio_feature_lengths=tuple(msg.audio_feature_lengths),
    )
    if len(layout.video_second_per_grid) != len(layout.video_grid_thw):
        raise InvalidRequest("media_layout: one video_second_per_grid per video", field="media_layout")
    if any(not (np.isfinite(s) and s > 0) for s in layout.video_second_per_grid) or any(
        n <= 0 for n in layout.audio_feature_lengths
    ):
        raise InvalidRequest("media_layout: seconds and lengths must be positive", field="media_layout")
    return layout if layout != MediaLayout() else None


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
        chunk_schedule=SCHEDULE_TO_PROTO[opens.plan.schedule],
        ignore_eos=opens.talker.ignore_eos,
        cache_scope=opens.talker.cache_scope,
    )


def code2wav_open_proto(rid: str, opens: StageOpens) -> stage_pb2.Code2WavOpen:
    assert opens.plan is not None
    return stage_pb2.Code2WavOpen(
        request_id=rid,
        mode=MODE_TO_PROTO[opens.mode],
        initial_chunk_frames=opens.plan.initial,
        chunk_frames=opens.plan.chunk,
        left_context_frames=opens.plan.left_context,
        chunk_schedule=SCHEDULE_TO_PROTO[opens.plan.schedule],
    )


def talker_input_proto(chunk: stage_pb2.ThinkerChunk) -> stage_pb2.TalkerInput:
    """A thinker chunk as talker input: chunk 0 carries the prompt (with, for media, the deep rows
    and the media layout, forwarded as they are), the finished one is the last. The tokens are the
    ones to speak (`spoken`: never a tool call), or all of them from a thinker older than that."""
    msg = stage_pb2.TalkerInput(
        prompt_ids=chunk.prompt_ids,
        token_ids=chunk.spoken.token_ids if chunk.HasField("spoken") else chunk.token_ids,
        last=chunk.finished,
        multimodal_positions=chunk.multimodal_positions,
    )
    if chunk.HasField("prompt_hidden"):
        msg.prompt_hidden.CopyFrom(chunk.prompt_hidden)
    if chunk.HasField("media_layout"):
        msg.media_layout.CopyFrom(chunk.media_layout)
    return msg


def codec_input_proto(chunk: stage_pb2.TalkerChunk) -> stage_pb2.CodecInput:
    """A talker chunk as code2wav input: the frames as they are (no re-encoding), the end as `last`."""
    return stage_pb2.CodecInput(codes=chunk.codes, first_frame=chunk.first_frame, last=chunk.finished)


def talker_chunk_from(chunk: stage_pb2.TalkerChunk, frame: int) -> stage_pb2.TalkerChunk:
    """`chunk` less its frames before `frame` (a chunk a resumed talker regenerated, part of which
    went on already); its codes re-encoded only when some of them are cut."""
    frames = chunk.codes.shape[1] if len(chunk.codes.shape) == 2 else 0
    skip = min(max(frame - chunk.first_frame, 0), frames)
    if not skip:
        return chunk
    codes = np.asarray(tensors.numpy_from_proto(chunk.codes, field="codes"))[:, skip:]
    out = stage_pb2.TalkerChunk(first_frame=chunk.first_frame + skip, finished=chunk.finished)
    out.key.CopyFrom(chunk.key)
    out.finish_reason = chunk.finish_reason
    out.codes.CopyFrom(tensors.to_proto(np.ascontiguousarray(codes)))
    return out
