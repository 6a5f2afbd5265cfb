"""A client's `conversation.item.create` as an item: its parts as the thinker takes them (media
still encoded, for the gateway's decoder) and as the client sees them.

Parts: `input_text` (any role), `input_audio` (base64 pcm16 24 kHz, user), `input_image` (a data URL,
user; the same decoding and limits as REST images), and for an assistant item `text`/`output_text`
or `output_audio` with its transcript (what it said is kept as text).
An item's media (a created item's or a committed turn's) are decoded once, before it joins the
conversation (`decode_parts`), so a response never waits on a decode.
"""

from __future__ import annotations

from typing import Any

from gateway.media.decode_pool import MediaDecoder
from gateway.media.parts import from_data_url
from gateway.realtime.audio import decode_base64_pcm, encoded_turn, settled
from gateway.realtime.client_items import Item as GivenItem
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.events import EventError
from gateway.realtime.function_calls import function_item
from gateway.realtime.vad import INPUT_RATE
from omnistream.request.errors import OmniError
from omnistream.request.media import AudioInput


def check_modality(modalities: tuple[str, ...] | None, kind: str, param: str) -> None:
    """Refuse a media kind the deployment's thinker does not take (None: not known yet)."""
    if modalities is not None and kind not in modalities:
        raise EventError(f"this deployment's model takes no {kind} input", code="invalid_value", param=param)


def item_parts(
    given: GivenItem, modalities: tuple[str, ...] | None, max_audio_bytes: int, event_id: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str, float]:
    """(thinker parts, client content, the item's text, seconds of audio) of a created message."""
    if given.role is None:
        raise EventError("a message item needs its role", code="invalid_value", param="item.role")
    if not given.content:
        raise EventError("a message item needs its content", code="invalid_value", param="item.content")
    parts: list[dict[str, Any]] = []
    content: list[dict[str, Any]] = []
    text = ""
    seconds = 0.0
    for i, part in enumerate(given.content):
        where = f"item.content.{i}"
        if given.role != "user" and part.type in ("input_audio", "input_image"):
            raise EventError(
                f"a {given.role} item takes text only", code="invalid_value", param=f"{where}.type"
            )
        if part.type in ("input_text", "text", "output_text"):
            if part.text is None:
                raise EventError("a text part needs `text`", code="invalid_value", param=f"{where}.text")
            parts.append({"type": "text", "text": part.text})
            content.append(
                {"type": "input_text" if given.role != "assistant" else "output_text", "text": part.text}
            )
            text += part.text
        elif part.type in ("output_audio", "audio") and given.role == "assistant":
            text += part.transcript or ""
            content.append({"type": "output_audio", "transcript": part.transcript or ""})
        elif part.type == "input_audio":
            if part.audio is None:
                raise EventError(
                    "an input_audio part needs `audio` (base64 pcm16 24 kHz)",
                    code="invalid_value",
                    param=f"{where}.audio",
                )
            check_modality(modalities, "audio", f"{where}.audio")
            pcm = decode_base64_pcm(part.audio, f"{where}.audio", max_audio_bytes, event_id)
            if not pcm:
                raise EventError("the audio is empty", code="invalid_value", param=f"{where}.audio")
            seconds += len(pcm) / 2 / INPUT_RATE
            parts.append({"type": "audio", "audio": encoded_turn(pcm, f"{where}.audio")})
            content.append({"type": "input_audio", "transcript": part.transcript})
        elif part.type == "input_image":
            if part.image_url is None:
                raise EventError(
                    "an input_image part needs `image_url` (a data URL)",
                    code="invalid_value",
                    param=f"{where}.image_url",
                )
            check_modality(modalities, "image", f"{where}.image_url")
            if part.image_url[:5].lower() != "data:":
                raise EventError(
                    "image_url must be a data: URL", code="invalid_value", param=f"{where}.image_url"
                )
            try:
                parts.append(
                    {
                        "type": "image",
                        "image": from_data_url(part.image_url, "image", f"{where}.image_url"),
                    }
                )
            except OmniError as exc:
                raise EventError.of(exc) from None
            content.append({"type": "input_image"})
        else:
            raise EventError(
                f"a {given.role} item cannot hold a {part.type} part",
                code="invalid_value",
                param=f"{where}.type",
            )
    return parts, content, text, seconds


async def created_item(
    given: GivenItem,
    item_id: str,
    conversation: Conversation,
    media: MediaDecoder,
    modalities: tuple[str, ...] | None,
    max_audio_bytes: int,
    event_id: str | None,
) -> Item:
    """The item a client gave (conversation.item.create's, or one in a response's `input`), its
    media decoded; a function call's result is checked against `conversation`'s calls."""
    if given.type != "message":  # a function call or its result
        return function_item(given.model_copy(update={"id": item_id}), conversation)
    parts, content, text, seconds = item_parts(given, modalities, max_audio_bytes, event_id)
    await decode_parts(media, parts, event_id)
    item = Item(item_id, given.role or "user", parts, content, audio_seconds=seconds)
    if given.role == "assistant":
        item.text = text
    return item


async def decode_parts(media: MediaDecoder, parts: list[dict[str, Any]], event_id: str | None) -> None:
    """Decode an item's media in place, in the gateway's decoder threads (a committed turn's and a
    created item's alike); its audio ends settled (gateway/realtime/audio.py), so its features stay
    those of its first turn."""
    try:
        await media.decode([{"role": "user", "content": parts}], False)
    except OmniError as exc:
        raise EventError.of(exc, event_id) from None
    for part in parts:
        if part["type"] == "audio" and isinstance(part["audio"], AudioInput):
            part["audio"] = settled(part["audio"])
