"""Chat turns on the stage API: the request model's messages (text, decoded media, tool calls) as
the thinker's `Message`s and back. Media travel decoded (raw bytes + dtype + shape); an audio part
the thinker already holds for the request's cache scope travels as its digest instead."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from omnistream.proto.omni.v1 import common_pb2
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import AudioInput, AudioRef, ImageInput, VideoInput
from omnistream.wire.tensors import fill_tensor, numpy_from_proto

# Elements one decoded media part may hold on the stage API (the gRPC message size bounds it too).
MAX_PART_ELEMENTS = 1 << 30


# Given a message's audio part: the digest to send instead of its samples (the thinker keeps that
# audio for the request's cache scope: gateway/serving/sent_audio.py), or None to send them.
Referrer = Callable[[AudioInput], "bytes | None"]


def fill_audio_part(
    target: common_pb2.AudioPart, audio: AudioInput, refer: Referrer | None = None
) -> common_pb2.AudioPart:
    digest = refer(audio) if refer is not None else None
    target.sample_rate = audio.sample_rate
    if digest is not None:
        target.digest = digest
    else:
        fill_tensor(target.samples, np.ascontiguousarray(audio.samples, dtype=np.float32).reshape(-1))
    return target


def fill_content_part(
    target: common_pb2.ContentPart, part: Mapping[str, Any], refer: Referrer | None = None
) -> common_pb2.ContentPart:
    """One part of a message's content (omnistream/request/media.py) as the stage API's decoded part,
    written into `target` (media are large: built in place, never copied between messages); an
    audio part as its digest where `refer` gives one."""
    kind = part["type"]
    if kind == "text":
        target.text = part["text"]
        return target
    media = part[kind]
    if kind == "audio" and isinstance(media, AudioInput):
        fill_audio_part(target.audio, media, refer)
    elif kind == "image" and isinstance(media, ImageInput):
        fill_tensor(target.image.pixels, np.ascontiguousarray(media.pixels, dtype=np.uint8))
    elif kind == "video" and isinstance(media, VideoInput):
        fill_tensor(target.video.frames, np.ascontiguousarray(media.frames, dtype=np.uint8))
        target.video.fps = media.fps
        if media.audio is not None:
            fill_audio_part(target.video.audio, media.audio)
    else:  # An encoded file here is a gateway bug: media are decoded before a request is admitted.
        raise TypeError(f"a {kind!r} part holding {type(media).__name__} cannot go to the thinker")
    return target


def message_proto(message: Mapping[str, Any], refer: Referrer | None = None) -> common_pb2.Message:
    return fill_message(common_pb2.Message(), message, refer)


def fill_message(
    target: common_pb2.Message, message: Mapping[str, Any], refer: Referrer | None = None
) -> common_pb2.Message:
    """A chat turn, written into `target` (a message's repeated field's `add()`): text-only content
    as `content` (as before media existed), else as `parts`; an assistant turn's tool calls and a
    tool turn's call id with it."""
    target.role = message["role"]
    content: str | Sequence[Mapping[str, Any]] = message["content"]
    if isinstance(content, str):
        target.content = content
    else:
        for part in content:
            fill_content_part(target.parts.add(), part, refer)
    for call in message.get("tool_calls") or ():
        function = call["function"]
        target.tool_calls.add(id=call.get("id") or "", name=function["name"], arguments=function["arguments"])
    if message.get("tool_call_id") is not None:
        target.tool_call_id = message["tool_call_id"]
    return target


def tool_calls_from_proto(calls: Sequence[common_pb2.ToolCall]) -> list[dict[str, Any]]:
    """A turn's tool calls in the request model's form (GenerationRequest.messages)."""
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


def messages_from_proto(messages: Sequence[common_pb2.Message]) -> list[dict[str, Any]]:
    """Stage-form chat turns as the request model's messages (decoded media as numpy arrays, zero
    copy). Only the forms the thinker takes are accepted; dtypes and shapes are checked again, with
    sizes, by the thinker before the request joins a batch."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m.parts and m.content:
            raise InvalidRequest(f"messages[{i}]: give content or parts, not both", field="messages")
        turn: dict[str, Any] = {"role": m.role}
        if not m.parts:
            turn["content"] = m.content
        else:
            turn["content"] = [
                _part_from_proto(p, f"messages[{i}].parts[{j}]") for j, p in enumerate(m.parts)
            ]
        if m.tool_calls:
            turn["tool_calls"] = tool_calls_from_proto(m.tool_calls)
        if m.tool_call_id:
            turn["tool_call_id"] = m.tool_call_id
        out.append(turn)
    return out


def _part_from_proto(part: common_pb2.ContentPart, where: str) -> dict[str, Any]:
    kind = part.WhichOneof("kind")
    if kind == "text":
        return {"type": "text", "text": part.text}
    if kind == "audio":
        if part.audio.digest:
            return {"type": "audio", "audio": _audio_ref_from_proto(part.audio, f"{where}.audio")}
        return {"type": "audio", "audio": _audio_from_proto(part.audio, f"{where}.audio")}
    if kind == "image":
        pixels = _array(part.image.pixels, "uint8", f"{where}.image.pixels")
        return {"type": "image", "image": ImageInput(pixels)}
    if kind == "video":
        frames = _array(part.video.frames, "uint8", f"{where}.video.frames")
        audio = None
        if part.video.HasField("audio"):
            audio = _audio_from_proto(part.video.audio, f"{where}.video.audio")
        return {"type": "video", "video": VideoInput(frames, part.video.fps, audio)}
    # `media` (encoded files) is the gateway's to decode; an empty part is nothing.
    raise InvalidRequest(f"{where}: the thinker takes text, audio, image or video parts", field="messages")


def _audio_from_proto(msg: common_pb2.AudioPart, where: str) -> AudioInput:
    if msg.digest:
        raise InvalidRequest(f"{where}: a video's sound travels as samples, not a digest", field="messages")
    return AudioInput(_array(msg.samples, "float32", f"{where}.samples"), int(msg.sample_rate))


DIGEST_BYTES = 32  # AudioPart.digest: a SHA-256


def _audio_ref_from_proto(msg: common_pb2.AudioPart, where: str) -> AudioRef:
    if msg.HasField("samples"):
        raise InvalidRequest(f"{where}: give samples or a digest, not both", field="messages")
    if len(msg.digest) != DIGEST_BYTES:
        raise InvalidRequest(
            f"{where}.digest is {len(msg.digest)} bytes; a SHA-256 is {DIGEST_BYTES}", field="messages"
        )
    return AudioRef(bytes(msg.digest), int(msg.sample_rate))


def _array(msg: common_pb2.Tensor, dtype: str, where: str) -> np.ndarray:
    return numpy_from_proto(msg, max_elements=MAX_PART_ELEMENTS, field=where, expect_dtype=dtype)
