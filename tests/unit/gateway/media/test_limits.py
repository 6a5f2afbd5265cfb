"""Media limits in the gateway config: refused when decoded media could not fit the one stage
message that carries them, or when base64 media could not fit the REST body."""

from __future__ import annotations

import pytest

from gateway.config import STAGE_MESSAGE_HEADROOM, GatewayConfig
from gateway.media.limits import MediaLimits, Tally
from omnistream.request.errors import TooLarge

STAGES = {"thinker": ["a:1"], "talker": ["b:1"], "code2wav": ["c:1"]}


def test_default_media_limits_are_valid_and_each_fits_the_decoded_budget():
    config = GatewayConfig(**STAGES)
    config.validate()
    limits = config.media_limits
    assert limits == MediaLimits()
    assert all(size <= limits.max_decoded_bytes for size in limits.worst_case_bytes().values())
    assert config.max_decoded_media_bytes <= config.max_message_bytes - STAGE_MESSAGE_HEADROOM
    assert config.max_media_bytes * 4 / 3 <= config.max_request_bytes


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ({"max_decoded_media_bytes": 16 * 1024 * 1024}, "max_decoded_media_bytes"),
        ({"max_audio_seconds": 600.0}, "max_audio_seconds allows"),
        ({"image_max_pixels": 16384 * 32 * 32}, "image_max_pixels allows"),
        ({"max_video_frames": 64, "video_total_pixels": 100_000_000}, "max_video_frames allows"),
        ({"max_media_bytes": 7 * 1024 * 1024}, "as base64"),
        ({"max_video_frames": 7}, "even number"),
        ({"video_fps": 0.0}, "video_fps must be positive"),
        ({"media_url_prefixes": ["ftp://host/"]}, "not an http"),
        ({"image_max_pixels": 100}, "at least 4096"),
    ],
)
def test_config_refuses_media_limits_that_cannot_be_carried(limits, message):
    with pytest.raises(ValueError, match=message):
        GatewayConfig(**STAGES, **limits).validate()


def test_a_bigger_stage_message_makes_room_for_bigger_media():
    GatewayConfig(
        **STAGES,
        max_message_bytes=64 * 1024 * 1024,
        max_decoded_media_bytes=48 * 1024 * 1024,
        max_audio_seconds=600.0,
    ).validate()


def test_the_reference_video_pixel_budget():
    limits = MediaLimits()
    # max(min(768 tokens, total / n * 2), 1.05 * 128 tokens), tokens of 32 x 32 pixels
    assert limits.video_frame_max_pixels(2) == 768 * 1024
    assert limits.video_frame_max_pixels(16) == 196_608
    assert limits.video_frame_max_pixels(1000) == int(128 * 1024 * 1.05)


def test_the_tally_stops_at_the_first_limit_passed():
    tally = Tally(MediaLimits(max_audio_seconds=1.0))
    tally.add_audio(16000, "a")
    with pytest.raises(TooLarge, match="max_audio_seconds") as info:
        tally.add_audio(1, "b")
    assert info.value.field == "b"
    budget = Tally(MediaLimits(max_decoded_bytes=20_000_000))
    with pytest.raises(TooLarge, match="max_decoded_media_bytes"):
        budget.add_bytes(20_000_001, "c")
