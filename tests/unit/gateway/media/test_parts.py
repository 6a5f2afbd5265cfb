"""Media parts as the APIs give them (data URLs, URLs, gRPC bytes) and as the thinker gets them
(ThinkerOpen parts): the syntactic checks, the gRPC mapping, and the stage message's encoding."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.api.grpc import message_content, to_generation_request
from gateway.config import GatewayConfig
from gateway.media.parts import EncodedMedia, from_bytes, from_data_url, from_input_audio, from_url, pending
from omnistream.proto.omni.v1 import common_pb2, gateway_pb2
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import AudioInput, ImageInput, VideoInput
from omnistream.request.stage_chain import stage_opens
from omnistream.wire.convert import thinker_open_proto
from omnistream.wire.tensors import numpy_from_proto

FIELD = "messages.0.content.0.image_url.url"
STAGES = {"thinker": ["a:1"], "talker": ["b:1"], "code2wav": ["c:1"]}


def test_a_base64_data_url_keeps_its_payload_and_type():
    item = from_data_url("data:image/PNG;base64,AAAA", "image", FIELD)
    assert (item.kind, item.mime, item.base64, item.field) == ("image", "image/png", "AAAA", FIELD)
    assert from_data_url("data:;base64,AAAA", "audio", FIELD).mime == ""  # sniffed later


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png,AAAA", "must be base64"),
        ("data:image/png;base64", "no ','"),
        ("data:audio/wav;base64,AAAA", "needs a image/\\* MIME type"),
        ("data:text/plain;base64,AAAA", "needs a image/\\* MIME type"),
    ],
)
def test_bad_data_urls_are_422_naming_the_field(url, message):
    with pytest.raises(InvalidRequest, match=message) as info:
        from_data_url(url, "image", FIELD)
    assert info.value.field == FIELD


@pytest.mark.parametrize(
    ("url", "prefixes", "message"),
    [
        ("ftp://host/a.png", ("https://host/",), "unsupported URL scheme"),
        ("javascript:alert(1)", (), "unsupported URL scheme"),
        ("https://host/a.png", (), "not accepted by this gateway"),
        ("file:///etc/passwd", (), "not accepted by this gateway"),
        ("https://other/a.png", ("https://host/",), "not under a prefix"),
        ("https://host/../a.png", ("https://host/",), "not under a prefix"),
        ("file:///srv/media/../../etc/passwd", ("file:///srv/media/",), "not under a prefix"),
        ("https://host@evil/a.png", ("https://host",), "not under a prefix"),
    ],
)
def test_urls_need_an_allowed_prefix(url, prefixes, message):
    with pytest.raises(InvalidRequest, match=message) as info:
        from_url(url, "image", FIELD, prefixes)
    assert info.value.field == FIELD


def test_an_allowed_url_is_kept_for_fetching():
    item = from_url("https://host/media/a.png", "image", FIELD, ("https://host/media/",))
    assert item.url == "https://host/media/a.png" and item.data is None and item.base64 is None


def test_input_audio_maps_its_format_and_names_the_format_field():
    assert from_input_audio("AAAA", "MP3", "m.input_audio.data").mime == "audio/mpeg"
    with pytest.raises(InvalidRequest) as info:
        from_input_audio("AAAA", "midi", "m.input_audio.data")
    assert info.value.field == "m.input_audio.format"


def test_grpc_media_need_a_known_kind_and_a_matching_type():
    with pytest.raises(InvalidRequest) as info:
        from_bytes("sound", "audio/wav", b"x", "messages.0.parts.0.media")
    assert info.value.field == "messages.0.parts.0.media.kind"
    with pytest.raises(InvalidRequest) as info:
        from_bytes("audio", "image/png", b"x", "messages.0.parts.0.media")
    assert info.value.field == "messages.0.parts.0.media.mime_type"
    item = from_bytes("audio", "", b"x", "messages.0.parts.0.media")
    assert (item.data, item.field) == (b"x", "messages.0.parts.0.media.data")


def test_grpc_parts_map_to_content_and_text_only_parts_to_one_string():
    text_only = common_pb2.Message(
        role="user", parts=[common_pb2.ContentPart(text="a"), common_pb2.ContentPart(text="b")]
    )
    assert message_content(text_only, 0) == "ab"
    assert message_content(common_pb2.Message(role="user", content="hi"), 0) == "hi"
    media = common_pb2.EncodedMedia(kind="audio", mime_type="audio/wav", data=b"RIFF")
    mixed = common_pb2.Message(
        role="user", parts=[common_pb2.ContentPart(text="hear"), common_pb2.ContentPart(media=media)]
    )
    content = message_content(mixed, 2)
    assert content[0] == {"type": "text", "text": "hear"}
    assert isinstance(content[1]["audio"], EncodedMedia)
    assert content[1]["audio"].field == "messages.2.parts.1.media.data"


@pytest.mark.parametrize(
    ("message", "field"),
    [
        (
            common_pb2.Message(
                role="user",
                parts=[common_pb2.ContentPart(audio=common_pb2.AudioPart(sample_rate=16000))],
            ),
            "messages.0.parts.0",
        ),
        (common_pb2.Message(role="user", parts=[common_pb2.ContentPart()]), "messages.0.parts.0"),
        (
            common_pb2.Message(role="user", content="x", parts=[common_pb2.ContentPart(text="y")]),
            "messages.0.content",
        ),
    ],
    ids=["decoded-form", "empty-part", "content-and-parts"],
)
def test_grpc_parts_the_client_api_does_not_take_are_invalid(message, field):
    with pytest.raises(InvalidRequest) as info:
        message_content(message, 0)
    assert info.value.field == field


def test_grpc_use_audio_in_video_is_unset_or_given():
    config = GatewayConfig(**STAGES)
    base = {"messages": [common_pb2.Message(role="user", content="hi")]}
    assert to_generation_request(gateway_pb2.GenerateRequest(**base), config).use_audio_in_video is False
    given = gateway_pb2.GenerateRequest(**base, use_audio_in_video=True)
    assert to_generation_request(given, config).use_audio_in_video is True


def test_pending_finds_only_encoded_parts():
    item = EncodedMedia("audio", "", "f", data=b"x")
    messages = [
        {"role": "user", "content": "text"},
        {"role": "user", "content": [{"type": "text", "text": "t"}, {"type": "audio", "audio": item}]},
        {"role": "user", "content": [{"type": "audio", "audio": AudioInput(np.zeros(3, np.float32))}]},
    ]
    assert [found for _, found in pending(messages)] == [item]


def test_thinker_open_carries_decoded_parts_and_use_audio_in_video():
    audio = AudioInput(np.linspace(-1, 1, 160, dtype=np.float32))
    image = ImageInput(np.arange(64 * 32 * 3, dtype=np.uint8).reshape(64, 32, 3))
    video = VideoInput(np.zeros((2, 32, 64, 3), np.uint8), 2.0, audio)
    messages = [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in these?"},
                {"type": "audio", "audio": audio},
                {"type": "image", "image": image},
                {"type": "video", "video": video},
            ],
        },
    ]
    request = GenerationRequest(messages=messages, use_audio_in_video=True)
    open_ = thinker_open_proto("r1", stage_opens(request, None), messages, None)
    assert open_.use_audio_in_video
    system, user = open_.messages
    assert system.content == "be brief" and not system.parts
    assert [p.WhichOneof("kind") for p in user.parts] == ["text", "audio", "image", "video"]
    assert user.parts[0].text == "what is in these?"
    assert user.parts[1].audio.sample_rate == 16000
    assert (numpy_from_proto(user.parts[1].audio.samples) == audio.samples).all()
    assert (numpy_from_proto(user.parts[2].image.pixels) == image.pixels).all()
    sent = user.parts[3].video
    assert sent.fps == 2.0 and numpy_from_proto(sent.frames).shape == (2, 32, 64, 3)
    assert numpy_from_proto(sent.audio.samples).shape == (160,)


def test_an_undecoded_part_never_reaches_the_thinker():
    messages = [
        {"role": "user", "content": [{"type": "audio", "audio": EncodedMedia("audio", "", "f", data=b"")}]}
    ]
    request = GenerationRequest(messages=messages)
    with pytest.raises(TypeError, match="cannot go to the thinker"):
        thinker_open_proto("r1", stage_opens(request, None), messages, None)
