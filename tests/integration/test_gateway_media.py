"""Bad media against the real gateway and stages: each file gets its 4xx naming the field before
admission (the thinker never hears of it), while a good request runs alongside and finishes."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator

import httpx
import openai
import pytest

from omnistream.cli.launcher import ServiceProcess
from omnistream.proto.omni.v1 import common_pb2, gateway_pb2
from tests.media_files import audio_file, image_file, video_file

from .conftest import configured_gateway, grpc_refusal, thinker_requests

CHAT = "/v1/chat/completions"
# Tiny generation limits, and media limits small enough that the oversize files are cheap to make.
CONFIG = {
    "max_tokens_limit": 4,
    "default_max_tokens": 4,
    "max_audio_frames": 4,
    "max_audio_seconds": 60.0,
    "max_image_input_pixels": 4_000_000,
}


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory) -> Iterator[ServiceProcess]:
    with configured_gateway(stages, tmp_path_factory.mktemp("media"), CONFIG) as gateway:
        yield gateway


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{b64(data)}"


def input_audio(data: str, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": data, "format": fmt}}


def url_part(kind: str, url: str) -> dict:
    return {"type": f"{kind}_url", f"{kind}_url": {"url": url}}


MP4 = video_file("mp4", seconds=2.0, sound=False)
# (part, status, param): the bad-media battery
BATTERY = {
    "truncated-video": (url_part("video", data_url("video/mp4", MP4[: len(MP4) // 2])), 422, "video_url.url"),
    "truncated-image": (url_part("image", data_url("image/png", image_file()[:300])), 422, "image_url.url"),
    "wrong-mime": (url_part("image", data_url("image/png", audio_file("wav"))), 422, "image_url.url"),
    "wrong-kind": (url_part("audio", data_url("image/png", image_file())), 422, "audio_url.url"),
    "zero-length-audio": (input_audio(""), 422, "input_audio.data"),
    "huge-image": (
        url_part("image", data_url("image/png", image_file("PNG", (2100, 2000)))),
        413,
        "image_url.url",
    ),
    "ten-minute-audio": (
        input_audio(b64(audio_file("ogg", seconds=600.0, channels=1, silent=True)), "ogg"),
        413,
        "input_audio.data",
    ),
    "base64-garbage": (input_audio("this is *not* base64!"), 422, "input_audio.data"),
    "data-url-not-base64": (url_part("image", "data:image/png,rawbytes"), 422, "image_url.url"),
    "scheme-not-allowed": (url_part("audio", "https://example.com/a.wav"), 422, "audio_url.url"),
    "unknown-scheme": (url_part("video", "gopher://example.com/v.mp4"), 422, "video_url.url"),
}


async def post(client: httpx.AsyncClient, content) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": content}], "modalities": ["text"]}
    return await client.post(CHAT, json=body)


def test_bad_media_get_4xx_naming_the_field_while_a_good_request_finishes(gateway, stages):
    async def run() -> tuple[httpx.Response, dict[str, httpx.Response]]:
        url = f"http://127.0.0.1:{gateway.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            good = post(client, "Hello")
            bad = [
                post(client, [{"type": "text", "text": "listen"}, part]) for part, _, _ in BATTERY.values()
            ]
            replies = await asyncio.gather(good, *bad)
        return replies[0], dict(zip(BATTERY, replies[1:], strict=True))

    before = thinker_requests(stages)
    good, replies = asyncio.run(run())
    assert good.status_code == 200, good.text
    assert good.json()["choices"][0]["message"]["content"] is not None
    for name, (_, status, param) in BATTERY.items():
        reply = replies[name]
        assert reply.status_code == status, (name, reply.text)
        error = reply.json()["error"]
        assert error["param"] == f"messages.0.content.1.{param}", (name, error)
        assert error["code"] == ("request_too_large" if status == 413 else "invalid_request"), (name, error)
    # Only the good request reached the thinker: every refusal happened at the door.
    assert thinker_requests(stages) == before + 1


def thinker_modalities(gateway: ServiceProcess) -> list[str]:
    models = httpx.get(f"http://127.0.0.1:{gateway.http_port}/v1/models", timeout=10).json()
    return models["data"][0]["omnistream"]["input_modalities"]


def check_good_media_reply(
    gateway: ServiceProcess, status: int, error: dict | None, kinds: list[str]
) -> None:
    """Good media pass the gateway's decoding; what follows depends on the deployment: a thinker that
    takes every kind answers, one that does not gets the gateway's 422 naming the first such part."""
    taken = thinker_modalities(gateway)
    missing = [kind for kind in kinds if kind not in taken]
    assert not missing, f"this deployment's thinker takes {taken}"  # Qwen3-Omni's hears and sees
    assert status == 200, error


def test_a_good_media_request_passes_the_gateway(gateway):
    content = [
        {"type": "text", "text": "What do you hear and see?"},
        input_audio(b64(audio_file("mp3", seconds=1.0)), "mp3"),
        url_part("image", data_url("image/jpeg", image_file("JPEG"))),
    ]
    reply = httpx.post(
        f"http://127.0.0.1:{gateway.http_port}{CHAT}",
        json={"messages": [{"role": "user", "content": content}], "modalities": ["text"]},
        timeout=120,
    )
    error = reply.json().get("error")
    check_good_media_reply(gateway, reply.status_code, error, ["audio", "image"])


@pytest.mark.parametrize(
    ("media", "code", "field", "kind"),
    [
        (
            common_pb2.EncodedMedia(kind="audio", mime_type="audio/wav", data=b"RIFF0000WAVE"),
            "INVALID_ARGUMENT",
            "media.data",
            "invalid_request",
        ),
        (
            common_pb2.EncodedMedia(kind="image", mime_type="audio/wav", data=b"x"),
            "INVALID_ARGUMENT",
            "media.mime_type",
            "invalid_request",
        ),
        (
            common_pb2.EncodedMedia(
                kind="audio",
                mime_type="audio/ogg",
                data=audio_file("ogg", seconds=600.0, channels=1, silent=True),
            ),
            "INVALID_ARGUMENT",
            "media.data",
            "request_too_large",
        ),
    ],
    ids=["corrupt", "wrong-mime", "too-long"],
)
def test_grpc_bad_media_are_invalid_argument_naming_the_field(gateway, stages, media, code, field, kind):
    parts = [common_pb2.ContentPart(text="listen"), common_pb2.ContentPart(media=media)]
    request = gateway_pb2.GenerateRequest(
        messages=[common_pb2.Message(role="user", parts=parts)], text_only=True
    )
    before = thinker_requests(stages)
    error = grpc_refusal(gateway, request)
    assert error.code().name == code, error
    assert f"messages.0.parts.1.{field}" in error.details(), error.details()
    assert dict(error.trailing_metadata())["omni-error-kind"] == kind
    assert thinker_requests(stages) == before


def test_the_readme_openai_sdk_example_sends_input_audio(gateway):
    """docs/serving.md's example, as the SDK sends it (the answer: see `check_good_media_reply`)."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="unused")
    audio = b64(audio_file("mp3", seconds=1.0))
    content = [
        {"type": "text", "text": "Answer the question in the recording."},
        {"type": "input_audio", "input_audio": {"data": audio, "format": "mp3"}},
    ]
    try:
        reply = client.chat.completions.create(
            model="qwen3-omni", modalities=["text"], messages=[{"role": "user", "content": content}]
        )
    except openai.UnprocessableEntityError as exc:
        check_good_media_reply(gateway, 422, exc.body, ["audio"])
    else:
        check_good_media_reply(gateway, 200, None, ["audio"])
        assert reply.choices[0].message.content is not None
    bad = [content[0], {"type": "input_audio", "input_audio": {"data": "bm90IGF1ZGlv", "format": "mp3"}}]
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": bad}])
    assert info.value.param == "messages.0.content.1.input_audio.data"


def test_openai_sdk_streams_text_and_audio_for_wav_mp3_and_image_parts(gateway):
    """The official SDK, streaming, with the three parts OpenAI's API defines for input media."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway.http_port}/v1", api_key="unused")
    content = [
        {
            "type": "input_audio",
            "input_audio": {"data": b64(audio_file("wav", seconds=1.0)), "format": "wav"},
        },
        {"type": "text", "text": "and then"},
        {
            "type": "input_audio",
            "input_audio": {"data": b64(audio_file("mp3", seconds=0.5)), "format": "mp3"},
        },
        {"type": "image_url", "image_url": {"url": data_url("image/png", image_file())}},
        {"type": "text", "text": "What did you hear and see?"},
    ]
    stream = client.chat.completions.create(
        model="qwen3-omni",
        messages=[{"role": "user", "content": content}],
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "pcm16"},
        stream=True,
        max_tokens=4,  # this module's gateway caps it at 4
        extra_body={"max_audio_frames": 4, "initial_codec_chunk_frames": 2},
    )
    text, audio_bytes, finish = "", 0, None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        assert delta.content is None  # with audio, the text is the transcript (as OpenAI)
        if delta.audio and delta.audio.transcript:
            text += delta.audio.transcript
        if delta.audio and delta.audio.data:
            audio_bytes += len(base64.b64decode(delta.audio.data))
        finish = chunk.choices[0].finish_reason or finish
    assert text and finish in ("stop", "length")
    assert audio_bytes > 0 and audio_bytes % 2 == 0  # 16-bit samples
