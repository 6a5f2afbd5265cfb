"""Keyword arguments -> the gateway's `GenerateRequest`: the one place both gRPC clients build it.

Sampling: the gRPC API takes a `Sampling` message as given once it is set (its zeros mean greedy /
off), so a caller who names only `seed` would silently get greedy text. Here every knob the caller
leaves out is filled from the project's one table of defaults (`omnistream.request.defaults`), so a
client call means the same as the same REST request.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, stage_pb2
from omnistream.request.defaults import DEFAULTS
from omnistream.wire.convert import SCHEDULE_TO_PROTO

Messages = str | Sequence[Mapping[str, Any]]
MEDIA_KINDS = ("audio", "image", "video")


def media(
    source: str | Path | bytes, kind: str | None = None, mime_type: str | None = None
) -> dict[str, Any]:
    """A media part for a message's content: a file path (kind and MIME type guessed from its name)
    or raw bytes (then name the kind; the gateway sniffs the format when no MIME type is given)."""
    if isinstance(source, bytes):
        data = source
        guessed = None
    else:
        path = Path(source)
        data = path.read_bytes()
        guessed = mimetypes.guess_type(path.name)[0]
    mime_type = mime_type or guessed or ""
    kind = kind or mime_type.split("/", 1)[0]
    if kind not in MEDIA_KINDS:
        raise ValueError(f"cannot tell whether {source!r} is audio, image or video: pass kind=")
    return {"type": kind, "data": data, "mime_type": mime_type}


def gateway_message(turn: Mapping[str, Any]) -> common_pb2.Message:
    """One chat turn for the gateway's API: text content, or parts (text, and media as encoded files)."""
    content = turn["content"]
    if isinstance(content, str):
        return common_pb2.Message(role=turn["role"], content=content)
    parts = []
    for part in content:
        if part["type"] == "text":
            parts.append(common_pb2.ContentPart(text=part["text"]))
        elif part["type"] in MEDIA_KINDS:
            encoded = common_pb2.EncodedMedia(
                kind=part["type"], mime_type=part.get("mime_type", ""), data=part["data"]
            )
            parts.append(common_pb2.ContentPart(media=encoded))
        else:
            raise ValueError(f"unknown content part type {part['type']!r}")
    return common_pb2.Message(role=turn["role"], parts=parts)


def _schedule(name: str) -> stage_pb2.ChunkSchedule:
    """A chunk schedule's name ("grow", "fixed") as the wire enum; the gateway cannot be sent a
    name it would not know, so a typo fails here, naming the field."""
    number = SCHEDULE_TO_PROTO.get(name)
    if number is None:
        raise ValueError(f"codec_chunk_schedule must be one of {', '.join(SCHEDULE_TO_PROTO)}, not {name!r}")
    return number


def _sampling(
    temperature: float | None,
    top_p: float | None,
    top_k: int | None,
    repetition_penalty: float | None,
    seed: int | None,
    talker: bool,
) -> common_pb2.Sampling | None:
    given = (temperature, top_p, top_k, repetition_penalty, seed)
    if all(v is None for v in given):
        return None  # the gateway applies the whole table
    prefix = "talker_" if talker else ""

    def default(name: str) -> Any:
        return getattr(DEFAULTS, prefix + name)

    msg = common_pb2.Sampling(
        temperature=default("temperature") if temperature is None else temperature,
        top_p=default("top_p") if top_p is None else top_p,
        top_k=default("top_k") if top_k is None else top_k,
        repetition_penalty=default("repetition_penalty")
        if repetition_penalty is None
        else repetition_penalty,
    )
    if seed is not None:
        msg.seed = seed
    return msg


def build_request(
    messages: Messages | None = None,
    *,
    prompt_ids: Sequence[int] | None = None,
    request_id: str | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    repetition_penalty: float | None = None,
    seed: int | None = None,
    audio: bool = True,
    voice: str | None = None,
    max_audio_frames: int | None = None,
    talker_temperature: float | None = None,
    talker_top_p: float | None = None,
    talker_top_k: int | None = None,
    talker_repetition_penalty: float | None = None,
    talker_seed: int | None = None,
    initial_codec_chunk_frames: int | None = None,
    codec_chunk_schedule: str | None = None,
    async_chunk: bool | None = None,
    ignore_eos: bool = False,
    timeout: float | None = None,
    use_audio_in_video: bool | None = None,
) -> gateway_pb2.GenerateRequest:
    """A `GenerateRequest` from keyword arguments; `messages` may be one user prompt as a string."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    request = gateway_pb2.GenerateRequest(
        request_id=request_id or "",
        messages=[gateway_message(m) for m in messages or ()],
        prompt_ids=list(prompt_ids or ()),
        max_tokens=max_tokens or 0,
        text_only=not audio,
        speaker=voice or "",
        max_audio_frames=max_audio_frames or 0,
        ignore_eos=ignore_eos,
    )
    thinker = _sampling(temperature, top_p, top_k, repetition_penalty, seed, talker=False)
    if thinker is not None:
        request.sampling.CopyFrom(thinker)
    # The talker follows the request's seed unless it has its own (as the table says).
    voice_seed = talker_seed if talker_seed is not None else seed
    talker = _sampling(
        talker_temperature, talker_top_p, talker_top_k, talker_repetition_penalty, voice_seed, talker=True
    )
    if talker is not None:
        request.talker_sampling.CopyFrom(talker)
    if initial_codec_chunk_frames is not None:
        request.initial_codec_chunk_frames = initial_codec_chunk_frames
    if codec_chunk_schedule is not None:
        request.codec_chunk_schedule = _schedule(codec_chunk_schedule)
    if async_chunk is not None:
        request.async_chunk = async_chunk
    if timeout is not None:
        request.timeout_seconds = timeout
    if use_audio_in_video is not None:
        request.use_audio_in_video = use_audio_in_video
    return request
