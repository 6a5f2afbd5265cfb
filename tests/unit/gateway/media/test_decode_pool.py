"""The decode pool: media replaced in place, the byte limit across items, URLs (file and http)
under the allowed prefixes only, the wall-clock bound, and the pool's bound on threads."""

from __future__ import annotations

import asyncio
import base64
import threading
import time

import httpx
import numpy as np
import pytest

import gateway.media.decode_pool as media_decoder
from gateway.admission.permits import Rejected
from gateway.media.decode_pool import MediaDecoder
from gateway.media.limits import MediaLimits
from gateway.media.parts import EncodedMedia, from_url
from omnistream.request.errors import InvalidRequest, TooLarge
from omnistream.request.media import AudioInput, ImageInput
from tests.media_files import audio_file, image_file

FIELD = "messages.0.content.0.input_audio.data"


def audio_part(data: bytes | None = None, b64: str | None = None, mime: str = "audio/wav") -> dict:
    return {"type": "audio", "audio": EncodedMedia("audio", mime, FIELD, data=data, base64=b64)}


def messages_of(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "text", "text": "hi"}, *parts]}]


@pytest.fixture
def decoder():
    decoder = MediaDecoder(MediaLimits())
    yield decoder
    decoder.close()


async def test_media_are_replaced_in_place_and_their_size_returned(decoder):
    messages = messages_of(audio_part(b64=base64.b64encode(audio_file("wav")).decode()))
    size = await decoder.decode(messages, use_audio_in_video=False)
    audio = messages[0]["content"][1]["audio"]
    assert isinstance(audio, AudioInput)
    assert size == audio.samples.nbytes


async def test_text_only_messages_cost_nothing(decoder):
    assert await decoder.decode([{"role": "user", "content": "hi"}], False) == 0


async def test_base64_garbage_is_422(decoder):
    with pytest.raises(InvalidRequest, match="not valid base64") as info:
        await decoder.decode(messages_of(audio_part(b64="@@@@")), False)
    assert info.value.field == FIELD


async def test_the_byte_limit_counts_every_item_of_the_request():
    data = audio_file("wav", seconds=0.5)
    decoder = MediaDecoder(MediaLimits(max_media_bytes=len(data) + 10))
    try:
        await decoder.decode(messages_of(audio_part(data)), False)
        with pytest.raises(TooLarge, match="max_media_bytes"):
            await decoder.decode(messages_of(audio_part(data), audio_part(data)), False)
    finally:
        decoder.close()


async def test_file_urls_under_an_allowed_prefix_are_read(tmp_path):
    (tmp_path / "cat.png").write_bytes(image_file())
    prefix = f"file://{tmp_path}/"
    decoder = MediaDecoder(MediaLimits(url_prefixes=(prefix,)))
    try:
        part = {"type": "image", "image": from_url(f"{prefix}cat.png", "image", "f", (prefix,))}
        await decoder.decode(messages_of(part), False)
        assert isinstance(part["image"], ImageInput)
        missing = {"type": "image", "image": from_url(f"{prefix}dog.png", "image", "f", (prefix,))}
        with pytest.raises(InvalidRequest, match="cannot be read"):
            await decoder.decode(messages_of(missing), False)
    finally:
        decoder.close()


async def test_http_urls_are_fetched_with_the_byte_limit_and_statuses_checked():
    wav = audio_file("wav", seconds=0.5)

    def serve(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/a.wav":
            return httpx.Response(200, content=wav, headers={"content-type": "audio/wav"})
        if request.url.path == "/big.wav":
            return httpx.Response(200, content=b"\0" * 200_000)
        return httpx.Response(404)

    prefix = "https://media.example/"
    limits = MediaLimits(url_prefixes=(prefix,), max_media_bytes=100_000)
    decoder = MediaDecoder(limits, http_transport=httpx.MockTransport(serve))

    def part(name: str) -> dict:
        return {"type": "audio", "audio": from_url(prefix + name, "audio", "u", (prefix,))}

    try:
        ok = part("a.wav")
        await decoder.decode(messages_of(ok), False)
        assert ok["audio"].samples.size == 8000
        with pytest.raises(InvalidRequest, match="HTTP 404"):
            await decoder.decode(messages_of(part("nope.wav")), False)
        with pytest.raises(TooLarge, match="max_media_bytes"):
            await decoder.decode(messages_of(part("big.wav")), False)
    finally:
        decoder.close()


async def test_a_decode_past_its_deadline_is_422_and_frees_its_slot_when_it_stops(monkeypatch):
    release = threading.Event()

    def slow_decode(data, mime, field, tally, deadline):
        release.wait(5)
        deadline.check(field)
        raise AssertionError("unreachable: the deadline has passed")

    monkeypatch.setattr(media_decoder, "decode_audio", slow_decode)
    decoder = MediaDecoder(MediaLimits(decode_timeout=0.3, decode_workers=1))
    try:
        started = time.monotonic()
        with pytest.raises(InvalidRequest, match="media_decode_timeout"):
            await decoder.decode(messages_of(audio_part(b"x")), False)
        assert time.monotonic() - started < 3.0
        # The thread still runs: the one slot is taken, so the next request waits, then is told busy.
        with pytest.raises(Rejected, match="busy"):
            await decoder.decode(messages_of(audio_part(b"x")), False)
        release.set()
        await asyncio.sleep(0.2)
        monkeypatch.setattr(
            media_decoder,
            "decode_audio",
            lambda *_: AudioInput(np.zeros(4, np.float32)),
        )
        await decoder.decode(messages_of(audio_part(b"x")), False)  # the slot is back
    finally:
        release.set()
        decoder.close()


async def test_the_event_loop_keeps_running_while_media_decode(decoder):
    data = audio_file("mp3", seconds=20.0)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    ticker = asyncio.create_task(tick())
    started = time.monotonic()
    await decoder.decode(messages_of(audio_part(data, mime="audio/mpeg")), False)
    elapsed = time.monotonic() - started
    ticker.cancel()
    assert ticks >= elapsed / 0.005 * 0.3  # the loop was not blocked by the decode


async def test_requests_beyond_the_waiting_bound_are_refused_at_once(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(media_decoder, "decode_audio", lambda *_: release.wait(5) and None)
    decoder = MediaDecoder(MediaLimits(decode_timeout=5.0, decode_workers=1))
    try:
        running = asyncio.create_task(decoder.decode(messages_of(audio_part(b"x")), False))
        await asyncio.sleep(0.05)
        waiting = [
            asyncio.create_task(decoder.decode(messages_of(audio_part(b"x")), False))
            for _ in range(media_decoder.MAX_WAITING_PER_WORKER)
        ]
        await asyncio.sleep(0.05)
        started = time.monotonic()
        with pytest.raises(Rejected) as info:
            await decoder.decode(messages_of(audio_part(b"x")), False)
        assert time.monotonic() - started < 0.5 and info.value.retry_after == media_decoder.RETRY_AFTER
    finally:
        release.set()
        for task in [running, *waiting]:
            task.cancel()
        await asyncio.gather(running, *waiting, return_exceptions=True)
        decoder.close()


def test_audio_decoded_elsewhere_meets_the_limits_a_decode_here_keeps():
    """A realtime turn resampled as it arrived (gateway/realtime/turn_resampler.py) is held to the
    byte, seconds and emptiness limits of its WAV decoded here, with the same errors."""
    decoder = MediaDecoder(MediaLimits(max_media_bytes=1000, max_audio_seconds=1.0))
    try:
        decoder.check_audio(1000, 16000, FIELD)  # at both limits: fine
        with pytest.raises(TooLarge, match="max_media_bytes") as too_big:
            decoder.check_audio(1001, 100, FIELD)
        with pytest.raises(TooLarge, match="max_audio_seconds"):
            decoder.check_audio(100, 16001, FIELD)
        with pytest.raises(InvalidRequest, match="empty"):
            decoder.check_audio(100, 0, FIELD)
        assert too_big.value.field == FIELD
    finally:
        decoder.close()
