"""Media parts through the REST face, against a core that runs the real validation and media
decoding but has no stages: what reaches `open`, and the 4xx (naming the field) for what does not."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from gateway.api.app import build_app
from gateway.cluster.readiness import Readiness
from gateway.config import GatewayConfig
from gateway.media.decode_pool import MediaDecoder
from gateway.serving.core import GatewayCore
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.request_checks import check_message_size
from omnistream.request.errors import TooLarge, Unavailable
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import AudioInput, ImageInput, VideoInput, text_of
from tests.media_files import audio_file, image_file, video_file
from tests.unit.gateway.infos import deployment_taking

STAGES = {"thinker": ["a:1"], "talker": ["b:1"], "code2wav": ["c:1"]}
CHAT = "/v1/chat/completions"
MODALITIES = ("text", "audio", "image", "video")


class MediaCore(GatewayCore):
    """`open` validates and decodes media as the real one does, records the request, then 503s."""

    def __init__(self, config: GatewayConfig, modalities: tuple[str, ...] = MODALITIES) -> None:
        config.validate()
        self.config = config
        self.deployment = deployment_taking(modalities)
        self.metrics = GatewayMetrics()
        self.replicas = SimpleNamespace(snapshot=lambda: {})
        self.media = MediaDecoder(config.media_limits)
        self.opened: list[GenerationRequest] = []

    @property
    def readiness(self) -> Readiness:
        return Readiness.of(lambda stage: True)

    async def open(self, request, request_id=None, timeout=None, trace=None):
        await self.prepare(request)
        self.opened.append(request)
        raise Unavailable("no stages in this test")


@pytest.fixture
def client_core():
    core = MediaCore(GatewayConfig(**STAGES, max_image_input_pixels=4_000_000))
    with TestClient(build_app(core), raise_server_exceptions=False) as client:
        yield client, core
    core.media.close()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{b64(data)}"


def chat(client, content, **extra):
    return client.post(CHAT, json={"messages": [{"role": "user", "content": content}], **extra})


def test_text_only_parts_stay_one_string_as_before(client_core):
    client, core = client_core
    reply = chat(client, [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert reply.status_code == 503
    assert core.opened[0].messages == [{"role": "user", "content": "ab"}]


def test_every_part_type_reaches_open_decoded_in_order(client_core):
    client, core = client_core
    content = [
        {"type": "text", "text": "listen"},
        {"type": "input_audio", "input_audio": {"data": b64(audio_file("mp3")), "format": "mp3"}},
        {"type": "image_url", "image_url": {"url": data_url("image/png", image_file()), "detail": "low"}},
        {"type": "audio_url", "audio_url": {"url": data_url("audio/ogg", audio_file("ogg"))}},
        {"type": "video_url", "video_url": {"url": data_url("video/mp4", video_file())}},
    ]
    reply = chat(client, content, use_audio_in_video=True)
    assert reply.status_code == 503, reply.text
    (request,) = core.opened
    parts = request.messages[0]["content"]
    assert [p["type"] for p in parts] == ["text", "audio", "image", "audio", "video"]
    assert isinstance(parts[1]["audio"], AudioInput) and isinstance(parts[3]["audio"], AudioInput)
    assert isinstance(parts[2]["image"], ImageInput)
    video = parts[4]["video"]
    assert isinstance(video, VideoInput) and video.audio is not None
    assert request.use_audio_in_video is True
    assert text_of(parts) == "listen"


def test_media_across_turns(client_core):
    client, core = client_core
    audio = {"type": "input_audio", "input_audio": {"data": b64(audio_file("wav")), "format": "wav"}}
    messages = [
        {"role": "user", "content": [audio, {"type": "text", "text": "what is this?"}]},
        {"role": "assistant", "content": "a tone"},
        {"role": "user", "content": [audio]},
    ]
    assert client.post(CHAT, json={"messages": messages}).status_code == 503
    turns = core.opened[0].messages
    assert turns[1]["content"] == "a tone"
    assert isinstance(turns[2]["content"][0]["audio"], AudioInput)
    assert core.opened[0].use_audio_in_video is False  # the default


@pytest.mark.parametrize(
    ("part", "status", "param"),
    [
        (
            {"type": "input_audio", "input_audio": {"data": "!!!not base64!!!", "format": "wav"}},
            422,
            "messages.0.content.0.input_audio.data",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
            422,
            "messages.0.content.0.input_audio.data",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "midi"}},
            422,
            "messages.0.content.0.input_audio.format",
        ),
        (
            {"type": "image_url", "image_url": {"url": "data:image/png,plain-text"}},
            422,
            "messages.0.content.0.image_url.url",
        ),
        (
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
            422,
            "messages.0.content.0.image_url.url",
        ),
        (
            {"type": "audio_url", "audio_url": {"url": "ftp://example.com/a.wav"}},
            422,
            "messages.0.content.0.audio_url.url",
        ),
        (
            {"type": "audio_url", "audio_url": {"url": data_url("image/png", image_file())}},
            422,
            "messages.0.content.0.audio_url.url",
        ),
        (
            {
                "type": "image_url",
                "image_url": {"url": data_url("image/png", image_file("PNG", (2500, 2000)))},
            },
            413,
            "messages.0.content.0.image_url.url",
        ),
        ({"type": "image", "image": "x"}, 422, "messages.0.content.0.type"),
        ({"text": "no type"}, 422, "messages.0.content.0.type"),
        ("a string", 422, "messages.0.content.0"),
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA"}},
            422,
            "messages.0.content.0.input_audio.format",
        ),
    ],
    ids=[
        "base64-garbage",
        "zero-length",
        "unknown-format",
        "not-base64-data-url",
        "url-not-allowed",
        "scheme",
        "wrong-mime-kind",
        "over-pixels",
        "unknown-part-type",
        "no-part-type",
        "not-an-object",
        "missing-field",
    ],
)
def test_bad_media_get_4xx_naming_the_field_before_open(client_core, part, status, param):
    client, core = client_core
    reply = chat(client, [part])
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["param"] == param, error
    assert error["code"] == ("request_too_large" if status == 413 else "invalid_request")
    assert not core.opened


def test_media_bytes_over_the_limit_are_413():
    core = MediaCore(GatewayConfig(**STAGES, max_media_bytes=100_000))
    with TestClient(build_app(core), raise_server_exceptions=False) as client:
        audio = {"type": "input_audio", "input_audio": {"data": b64(audio_file("wav")), "format": "wav"}}
        reply = chat(client, [audio])
    core.media.close()
    assert reply.status_code == 413
    assert reply.json()["error"]["param"] == "messages.0.content.0.input_audio.data"
    assert "max_media_bytes" in reply.json()["error"]["message"]


def test_text_and_decoded_media_must_fit_one_stage_message():
    request = GenerationRequest(messages=[{"role": "user", "content": "x" * 1000}])
    check_message_size(request, 1000, 100_000)
    with pytest.raises(TooLarge, match="stage message"):
        check_message_size(request, 100_000, 100_000)


def test_openapi_documents_the_media_parts(client_core):
    client, _ = client_core
    schema = client.get("/openapi.json").json()
    names = set(schema["components"]["schemas"])
    assert {"InputAudioPart", "ImageUrlPart", "AudioUrlPart", "VideoUrlPart"} <= names
    assert "use_audio_in_video" in schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]


def test_media_the_thinker_does_not_take_are_422_naming_the_part():
    core = MediaCore(GatewayConfig(**STAGES), modalities=("text", "audio"))
    with TestClient(build_app(core), raise_server_exceptions=False) as client:
        image = {"type": "image_url", "image_url": {"url": data_url("image/png", image_file())}}
        reply = chat(client, [{"type": "text", "text": "look"}, image])
        bad = {"type": "image_url", "image_url": {"url": data_url("image/png", b"not a png")}}
        corrupt = chat(client, [bad])
    core.media.close()
    assert reply.status_code == 422
    error = reply.json()["error"]
    assert error["param"] == "messages.0.content.1.image_url.url"
    assert "takes no image input" in error["message"] and "text, audio" in error["message"]
    # a bad file is reported as such, whatever the deployment takes
    assert "not a valid PNG" in corrupt.json()["error"]["message"]
    assert not core.opened


def test_a_cache_salt_reaches_open_as_the_requests_scope(client_core):
    from omnistream.request.defaults import cache_scope_of_salt

    client, core = client_core
    assert chat(client, "hi", cache_salt="tenant-a").status_code == 503
    assert chat(client, "hi").status_code == 503
    assert [r.cache_scope for r in core.opened] == [cache_scope_of_salt("tenant-a"), b""]
    assert chat(client, "hi", cache_salt="").status_code == 422  # an empty salt is no salt
