"""Decoding per format, on files made on the spot (tests/media_files.py): rates, lengths,
channels, the reference's resize and frame rules, and a 4xx naming the field for every bad file."""

from __future__ import annotations

import io
import wave

import av
import numpy as np
import pytest
from PIL import Image

from gateway.media.file_decode import Deadline, decode_audio, decode_image, decode_video
from gateway.media.limits import MediaLimits, Tally
from gateway.media.sizes import frame_indices, smart_nframes, smart_resize
from omnistream.request.errors import InvalidRequest, TooLarge
from tests.media_files import audio_file, image_file, video_file

LIMITS = MediaLimits()
FIELD = "messages.0.content.1.input_audio.data"
AUDIO_MIME = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "ogg": "audio/ogg",
    "flac": "audio/flac",
    "webm": "audio/webm",
    "m4a": "audio/mp4",
}


def audio(data: bytes, mime: str, limits: MediaLimits = LIMITS, seconds: float = 10.0):
    return decode_audio(data, mime, FIELD, Tally(limits), Deadline(seconds))


def image(data: bytes, mime: str, limits: MediaLimits = LIMITS):
    return decode_image(data, mime, FIELD, Tally(limits), limits)


def video(data: bytes, mime: str = "video/mp4", with_audio: bool = True, limits: MediaLimits = LIMITS):
    return decode_video(data, mime, FIELD, Tally(limits), limits, Deadline(10.0), with_audio)


def empty_wav() -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
    return buffer.getvalue()


def peak_hz(samples: np.ndarray, rate: int = 16000) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.fft.rfftfreq(samples.size, 1 / rate)[spectrum.argmax()])


@pytest.mark.parametrize("kind", sorted(AUDIO_MIME))
def test_each_audio_format_decodes_to_16k_mono_float32_of_the_same_tone(kind):
    decoded = audio(audio_file(kind, seconds=1.0, rate=44100, channels=2), AUDIO_MIME[kind])
    assert decoded.sample_rate == 16000
    assert decoded.samples.dtype == np.float32 and decoded.samples.ndim == 1
    # one second, give or take an encoder's priming samples
    assert abs(decoded.samples.size - 16000) <= 400, decoded.samples.size
    assert abs(peak_hz(decoded.samples) - 440) <= 2
    # the channels are averaged (left 0.5, right 0.4), as the reference's librosa does
    assert 0.40 <= np.abs(decoded.samples).max() <= 0.6


@pytest.mark.parametrize("rate", [8000, 22050, 48000])
def test_audio_is_resampled_to_16k_from_any_rate(rate):
    decoded = audio(audio_file("wav", seconds=2.0, rate=rate, channels=1), "audio/wav")
    assert decoded.samples.size == pytest.approx(32000, abs=32)
    assert abs(peak_hz(decoded.samples) - 440) <= 1
    assert np.abs(decoded.samples).max() == pytest.approx(0.5, abs=0.02)


def test_an_empty_mime_type_is_sniffed_among_the_supported_formats():
    assert audio(audio_file("flac"), "").samples.size == pytest.approx(16000, abs=16)
    with pytest.raises(InvalidRequest, match=r"not a supported media file|unsupported media container"):
        audio(image_file("PNG"), "")


@pytest.mark.parametrize(
    ("data", "mime", "message"),
    [
        (audio_file("wav"), "audio/mpeg", "not (a )?valid mp3"),
        (image_file("PNG"), "audio/wav", "not a valid wav file"),
        (audio_file("wav"), "audio/x-unknown", "unsupported audio type"),
        (empty_wav(), "audio/wav", "empty"),
        (audio_file("wav", seconds=2.0)[:-100_000], "audio/wav", "truncated"),
        (b"\x00" * 64, "audio/ogg", "not a valid ogg file"),
    ],
    ids=["wav-as-mp3", "png-as-wav", "unknown-type", "zero-length", "truncated", "garbage"],
)
def test_bad_audio_is_422_naming_the_field(data, mime, message):
    with pytest.raises(InvalidRequest, match=message) as info:
        audio(data, mime)
    assert not isinstance(info.value, TooLarge)
    assert info.value.field == FIELD


def test_ten_minutes_of_audio_is_refused_from_the_header_before_decoding():
    data = audio_file("mp3", seconds=600.0, rate=16000, channels=1, silent=True)
    assert len(data) < 2_000_000  # silence compresses: a cheap file for a big limit
    with pytest.raises(TooLarge, match="max_audio_seconds") as info:
        audio(data, "audio/mpeg", MediaLimits(max_audio_seconds=60.0), seconds=1.0)
    assert info.value.field == FIELD


def test_audio_seconds_are_counted_across_the_request():
    limits = MediaLimits(max_audio_seconds=3.0)
    tally = Tally(limits)
    data = audio_file("wav", seconds=2.0)
    decode_audio(data, "audio/wav", FIELD, tally, Deadline(10))
    with pytest.raises(TooLarge, match="max_audio_seconds"):
        decode_audio(data, "audio/wav", "second", tally, Deadline(10))


def test_a_passed_deadline_stops_decoding_with_422():
    with pytest.raises(InvalidRequest, match="media_decode_timeout"):
        audio(audio_file("wav"), "audio/wav", seconds=0.0)


# --- images ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("height", "width", "expected"),
    [
        (600, 1000, (608, 992)),  # rounded to multiples of 32
        (10, 10, (64, 64)),  # below 4 tokens: scaled up
        (4000, 3000, (1312, 960)),  # above 1280 tokens: scaled down, aspect kept
        (32, 32, (64, 64)),
    ],
)
def test_smart_resize_follows_the_reference(height, width, expected):
    h, w = smart_resize(height, width, 32, LIMITS.image_min_pixels, LIMITS.image_max_pixels)
    assert (h, w) == expected
    assert h % 32 == 0 and w % 32 == 0
    assert LIMITS.image_min_pixels <= h * w <= LIMITS.image_max_pixels


def test_smart_resize_with_the_reference_defaults_and_patch_14():
    # qwen-vl-utils' own example: 28 = 14 x 2, defaults 4..16384 tokens
    assert smart_resize(1080, 1920, 28, 4 * 28 * 28, 16384 * 28 * 28) == (1092, 1932)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_each_image_format_decodes_to_resized_rgb(fmt):
    decoded = image(image_file(fmt, (1000, 600)), f"image/{fmt.lower()}")
    assert decoded.pixels.dtype == np.uint8
    assert decoded.pixels.shape == (608, 992, 3)


def test_transparency_goes_on_white_like_the_reference():
    decoded = image(image_file("PNG", (64, 64), mode="RGBA"), "image/png")
    assert (decoded.pixels == 255).all()


def test_an_animated_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (64, 64), color) for color in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    pixels = image(buffer.getvalue(), "image/gif").pixels
    assert pixels[..., 0].mean() > 200 and pixels[..., 2].mean() < 50


@pytest.mark.parametrize(
    ("data", "mime", "error", "message"),
    [
        (image_file("JPEG"), "image/png", InvalidRequest, "not a valid PNG"),
        (image_file("PNG")[:200], "image/png", InvalidRequest, "corrupt"),
        (image_file("PNG"), "image/tiff", InvalidRequest, "unsupported image type"),
        (image_file("PNG", (4000, 10)), "image/png", InvalidRequest, "aspect ratio"),
        (image_file("PNG", (3000, 2000)), "image/png", TooLarge, "max_image_input_pixels"),
    ],
    ids=["jpeg-as-png", "truncated", "unsupported", "aspect", "over-pixels"],
)
def test_bad_images_are_4xx_naming_the_field(data, mime, error, message):
    limits = MediaLimits(max_image_input_pixels=5_000_000)
    with pytest.raises(InvalidRequest, match=message) as info:
        image(data, mime, limits)
    assert type(info.value) is error and info.value.field == FIELD


# --- video ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("total", "fps", "expected"),
    [(30, 10.0, 6), (300, 30.0, 16), (20, 10.0, 4), (5, 25.0, 4), (3, 25.0, 2), (31, 10.0, 6)],
)
def test_smart_nframes_follows_the_reference(total, fps, expected):
    assert smart_nframes(total, fps, LIMITS) == expected


def test_a_one_frame_video_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        smart_nframes(1, 25.0, LIMITS)


def test_frame_indices_spread_from_first_to_last():
    assert frame_indices(30, 6) == [0, 6, 12, 17, 23, 29]


@pytest.mark.parametrize(("kind", "mime"), [("mp4", "video/mp4"), ("webm", "video/webm")])
def test_video_frames_are_sampled_at_2_fps_with_the_sound_track(kind, mime):
    decoded = video(video_file(kind, seconds=3.0, fps=10), mime)
    frames, _, _, _ = decoded.frames.shape
    assert frames == 6 and decoded.fps == pytest.approx(2.0)
    assert decoded.frames.shape[1] % 32 == 0 and decoded.frames.shape[2] % 32 == 0
    # the reference's video pixel floor (128 tokens) scales a small video up
    assert decoded.frames.shape[1] * decoded.frames.shape[2] >= LIMITS.video_min_pixels
    brightness = decoded.frames.reshape(frames, -1).mean(axis=1)
    assert (np.diff(brightness) > 0).all()  # in order, first to last
    assert decoded.audio is not None
    assert decoded.audio.samples.size == pytest.approx(48000, abs=1500)
    assert abs(peak_hz(decoded.audio.samples) - 440) <= 2


def test_video_without_use_audio_in_video_has_no_sound():
    assert video(video_file("mp4", sound=True), with_audio=False).audio is None


def test_use_audio_in_video_needs_a_sound_track():
    with pytest.raises(InvalidRequest, match="sound track"):
        video(video_file("mp4", sound=False))


def test_a_long_video_is_413():
    with pytest.raises(TooLarge, match="max_video_seconds"):
        video(
            video_file("mp4", seconds=3.0, fps=5, sound=False),
            with_audio=False,
            limits=MediaLimits(max_video_seconds=2.0),
        )


def test_a_long_video_is_sampled_to_at_most_max_video_frames():
    decoded = video(
        video_file("mp4", seconds=6.0, fps=10, sound=False),
        with_audio=False,
        limits=MediaLimits(max_video_frames=8),
    )
    assert decoded.frames.shape[0] == 8
    assert decoded.fps == pytest.approx(8 / 60 * 10)


def test_a_truncated_video_is_422():
    data = video_file("mp4", seconds=3.0, sound=False)
    with pytest.raises(InvalidRequest) as info:
        video(data[: len(data) // 2], with_audio=False)
    assert info.value.field == FIELD and not isinstance(info.value, TooLarge)


def test_pyav_is_the_decoder():
    assert av.__version__  # the gateway's one FFmpeg: PyAV's bundled build
