"""conversation.item.create's content parts: what the thinker gets, what the client sees, refusals;
a decoder's refusal of an item's media as the event's error."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.media.parts import EncodedMedia
from gateway.realtime.client_items import Item
from gateway.realtime.events import EventError
from gateway.realtime.items import decode_parts, item_parts
from omnistream.request.errors import InvalidRequest

PCM = base64.b64encode(bytes(4800)).decode()  # 0.1 s
PNG = "data:image/png;base64,iVBORw0KGgo="


def test_a_user_item_keeps_media_encoded_for_the_decoder_in_order():
    given = Item.model_validate(
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": PNG},
                {"type": "input_audio", "audio": PCM},
                {"type": "input_text", "text": "What is it?"},
            ],
        }
    )
    parts, content, text, seconds = item_parts(given, ("text", "audio", "image"), 10**6, None)
    assert [p["type"] for p in parts] == ["image", "audio", "text"]
    assert all(isinstance(p[p["type"]], EncodedMedia) for p in parts[:2])
    assert [c["type"] for c in content] == ["input_image", "input_audio", "input_text"]
    assert (text, seconds) == ("What is it?", 0.1)


def test_an_assistant_item_is_its_text():
    given = Item.model_validate(
        {"role": "assistant", "content": [{"type": "output_audio", "transcript": "Hi."}]}
    )
    parts, content, text, _ = item_parts(given, None, 10**6, None)
    assert (parts, text) == ([], "Hi.")
    assert content == [{"type": "output_audio", "transcript": "Hi."}]


@pytest.mark.parametrize(
    ("role", "part", "modalities", "param"),
    [
        ("assistant", {"type": "input_audio", "audio": PCM}, None, "item.content.0.type"),
        ("user", {"type": "input_audio"}, None, "item.content.0.audio"),
        ("user", {"type": "input_audio", "audio": PCM}, ("text",), "item.content.0.audio"),
        ("user", {"type": "input_image", "image_url": "https://x/y.png"}, None, "item.content.0.image_url"),
        (
            "user",
            {"type": "input_image", "image_url": "data:text/plain;base64,AA=="},
            None,
            "item.content.0.image_url",
        ),
        ("user", {"type": "output_audio", "transcript": "x"}, None, "item.content.0.type"),
    ],
)
def test_bad_parts_are_refused_naming_the_part(role, part, modalities, param):
    given = Item.model_validate({"role": role, "content": [part]})
    with pytest.raises(EventError) as caught:
        item_parts(given, modalities, 10**6, None)
    assert caught.value.param == param


def test_media_the_decoder_refuses_are_refused_as_the_events_error_naming_the_field():
    async def refuse(messages: Any, use_audio_in_video: bool) -> int:
        raise InvalidRequest("the audio is not a WAV file", field="item.content.0.audio")

    media = EncodedMedia("audio", "audio/wav", "item.content.0.audio", data=b"")
    parts: list[dict[str, Any]] = [{"type": "audio", "audio": media}]
    with pytest.raises(EventError) as caught:
        asyncio.run(decode_parts(SimpleNamespace(decode=refuse), parts, "e7"))  # type: ignore[arg-type]
    assert caught.value.message == "the audio is not a WAV file" and caught.value.event_id == "e7"
    assert caught.value.code == "invalid_request" and caught.value.param == "item.content.0.audio"
