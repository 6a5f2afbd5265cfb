"""Media files to the arrays the model's processor takes: PyAV (FFmpeg) for sound and video,
Pillow for images. Torch-free, and run by the gateway, not the thinker, on purpose:

* bad media is refused at the door with a 4xx, before admission and before anything joins a
  batch, so one corrupt or hostile file costs its sender a refusal and nobody else a failed step;
* the thinker's accelerator process does no FFmpeg work (no demuxing, no resampling, no codec
  threads beside the model), it only feature-extracts arrays;
* limits (bytes, seconds, pixels, frames) are enforced in one place, as the data is produced.

What comes out follows Qwen's reference preprocessing (qwen-omni-utils / qwen-vl-utils 0.0.9-0.0.14,
read, not imported: they pull torchvision and librosa): audio mono float32 at 16 kHz; images RGB
(transparency on white), `smart_resize`d to multiples of patch_size x spatial_merge_size within the
pixel bounds, bicubic; videos sampled at 2 fps to an even number of frames (`smart_nframes`), each
frame `smart_resize`d with the video pixel budget, the sound track decoded like audio on request.

Every function here is synchronous and meant for a worker thread (see gateway/media/decode_pool.py);
each checks its `Deadline` between packets, so a file built to decode slowly stops itself.
Errors are `InvalidRequest` (422: corrupt, unsupported, wrong type, empty) or `TooLarge` (413),
always naming `field`.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from contextlib import contextmanager

import av
import numpy as np
from PIL import Image, UnidentifiedImageError

from gateway.media.limits import MediaLimits, Tally
from gateway.media.sizes import frame_indices, smart_nframes, smart_resize
from omnistream.request.errors import InvalidRequest, TooLarge
from omnistream.request.media import AUDIO_SAMPLE_RATE, AudioInput, ImageInput, VideoInput

# MIME type -> FFmpeg demuxer. Naming the demuxer (instead of letting FFmpeg probe) keeps the attack
# surface to the formats the API documents, and is what makes a wrong MIME type an error.
AUDIO_DEMUXERS = {
    "audio/wav": "wav",
    "audio/x-wav": "wav",
    "audio/wave": "wav",
    "audio/vnd.wave": "wav",
    "audio/mpeg": "mp3",
    "audio/mp3": "mp3",
    "audio/ogg": "ogg",
    "audio/opus": "ogg",
    "audio/flac": "flac",
    "audio/x-flac": "flac",
    "audio/webm": "matroska",
    "audio/mp4": "mov",
    "audio/m4a": "mov",
    "audio/x-m4a": "mov",
    "audio/aac": "aac",
}
VIDEO_DEMUXERS = {
    "video/mp4": "mov",
    "video/quicktime": "mov",
    "video/webm": "matroska",
    "video/x-matroska": "matroska",
}
IMAGE_FORMATS = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/jpg": "JPEG",
    "image/webp": "WEBP",
    "image/gif": "GIF",
}
# Containers whose header states the duration exactly, so holding much less means a cut-off file
# (mp3 and raw aac only estimate it from the bitrate).
EXACT_DURATION = frozenset({"wav", "flac", "mov", "matroska"})


class Deadline:
    """A wall-clock bound shared by one request's decodes."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def check(self, field: str) -> None:
        if time.monotonic() > self.end:
            raise InvalidRequest(
                f"the media took over {self.seconds:g} s to decode (the gateway's media_decode_timeout)",
                field=field,
            )


def _demuxer(mime: str, table: dict[str, str], kind: str, field: str) -> str | None:
    if not mime:
        return None  # sniffed, then checked against the table (`_check_sniffed`)
    demuxer = table.get(mime.lower())
    if demuxer is None:
        raise InvalidRequest(
            f"unsupported {kind} type {mime!r}; supported: {', '.join(sorted(table))}", field=field
        )
    return demuxer


@contextmanager
def _container(
    data: bytes, demuxer: str | None, table: dict[str, str], field: str
) -> Iterator[av.container.InputContainer]:
    try:
        container = av.open(io.BytesIO(data), mode="r", format=demuxer)
    except (av.FFmpegError, OSError, ValueError, UnicodeDecodeError) as exc:
        expected = f"a valid {demuxer} file" if demuxer else "a supported media file"
        raise InvalidRequest(f"the data is not {expected} ({_reason(exc)})", field=field) from None
    try:
        if demuxer is None and not set(container.format.name.split(",")) & set(table.values()):
            raise InvalidRequest(f"unsupported media container {container.format.name!r}", field=field)
        for stream in (*container.streams.audio, *container.streams.video):
            # One decoding thread per stream: the pool's size is the bound on decoding CPU.
            stream.codec_context.thread_count = 1
        yield container
    finally:
        container.close()


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _declared_seconds(container: av.container.InputContainer, stream: av.stream.Stream) -> float | None:
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / av.time_base
    return None


def _read_audio(
    container: av.container.InputContainer,
    stream: av.audio.stream.AudioStream,
    field: str,
    tally: Tally,
    deadline: Deadline,
) -> np.ndarray:
    """The stream as mono float32 at 16 kHz: FFmpeg's resampler changes the rate, channels are then
    averaged (the reference's librosa `to_mono`; FFmpeg's own downmix would weigh them -3 dB)."""
    resampler = av.AudioResampler(format="fltp", rate=AUDIO_SAMPLE_RATE)
    chunks: list[np.ndarray] = []

    def take(frames: list[av.AudioFrame]) -> None:
        for out in frames:
            planes = out.to_ndarray()  # [channels, n]
            samples = planes.mean(axis=0, dtype=np.float32) if planes.shape[0] > 1 else planes[0]
            tally.add_audio(samples.size, field)
            chunks.append(samples.astype(np.float32, copy=False))

    try:
        for packet in container.demux(stream):
            deadline.check(field)
            for frame in packet.decode():
                take(resampler.resample(frame))
        take(resampler.resample(None))
    except (av.FFmpegError, ValueError) as exc:
        name = container.format.name.split(",")[0]
        raise InvalidRequest(f"the data is not valid {name} audio ({_reason(exc)})", field=field) from None
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    if not np.isfinite(samples).all():
        raise InvalidRequest("the audio decodes to non-finite samples", field=field)
    return np.clip(samples, -1.0, 1.0)


def _check_complete(
    container: av.container.InputContainer, declared: float | None, got: float, field: str
) -> None:
    names = set(container.format.name.split(","))
    if declared and names & EXACT_DURATION and got < 0.9 * declared - 0.2:
        raise InvalidRequest(
            f"the file is truncated: it declares {declared:.2f} s but holds {got:.2f} s", field=field
        )


def wav_is_truncated(data: bytes) -> bool:
    """The RIFF header's data chunk claims more bytes than the file has. (FFmpeg's wav demuxer
    quietly shortens the duration to what is there, so the duration check cannot see it.) Sizes of
    0 and 0xFFFFFFFF are what streaming writers put before they know the size: not a claim."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return False
    offset = 12
    while offset + 8 <= len(data):
        chunk, size = data[offset : offset + 4], int.from_bytes(data[offset + 4 : offset + 8], "little")
        if chunk == b"data":
            return size not in (0, 0xFFFFFFFF) and offset + 8 + size > len(data)
        offset += 8 + size + (size & 1)
    return False


def decode_audio(data: bytes, mime: str, field: str, tally: Tally, deadline: Deadline) -> AudioInput:
    demuxer = _demuxer(mime, AUDIO_DEMUXERS, "audio", field)
    with _container(data, demuxer, AUDIO_DEMUXERS, field) as container:
        if "wav" in container.format.name.split(",") and wav_is_truncated(data):
            raise InvalidRequest("the file is truncated: its header promises more samples", field=field)
        if not container.streams.audio:
            raise InvalidRequest("the file has no audio track", field=field)
        stream = container.streams.audio[0]
        declared = _declared_seconds(container, stream)
        if declared is not None:
            tally.check_audio_duration(declared, field)
        samples = _read_audio(container, stream, field, tally, deadline)
        if not samples.size:
            raise InvalidRequest("the audio is empty (no samples)", field=field)
        _check_complete(container, declared, samples.size / AUDIO_SAMPLE_RATE, field)
    return AudioInput(samples)


# --- images ---------------------------------------------------------------------------------------
def _resized(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int, field: str
) -> tuple[int, int]:
    try:
        return smart_resize(height, width, factor, min_pixels, max_pixels)
    except ValueError as exc:
        raise InvalidRequest(str(exc), field=field) from None


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, transparent pixels on white (the reference's `to_rgb`, extended to palette and LA)."""
    if image.mode in ("P", "LA", "PA") or (image.mode != "RGBA" and "transparency" in image.info):
        image = image.convert("RGBA")
    if image.mode == "RGBA":
        background = Image.new("RGB", image.size, (255, 255, 255))
        background.paste(image, mask=image.getchannel("A"))
        return background
    return image.convert("RGB")


def _check_pixels(width: int, height: int, limits: MediaLimits, field: str) -> None:
    if width <= 0 or height <= 0:
        raise InvalidRequest("the image has no pixels", field=field)
    if width * height > limits.max_image_input_pixels:
        raise TooLarge(
            f"the image has {width}x{height} pixels; at most {limits.max_image_input_pixels} are accepted "
            "(the gateway's max_image_input_pixels)",
            field=field,
        )


def decode_image(data: bytes, mime: str, field: str, tally: Tally, limits: MediaLimits) -> ImageInput:
    if mime and mime.lower() not in IMAGE_FORMATS:
        raise InvalidRequest(
            f"unsupported image type {mime!r}; supported: {', '.join(sorted(IMAGE_FORMATS))}", field=field
        )
    formats = [IMAGE_FORMATS[mime.lower()]] if mime else sorted(set(IMAGE_FORMATS.values()))
    try:
        with Image.open(io.BytesIO(data), formats=formats) as image:
            _check_pixels(image.width, image.height, limits, field)  # from the header: before decoding
            image.seek(0)  # an animation's first frame, as the reference takes
            image.load()
            rgb = to_rgb(image)
    except Image.DecompressionBombError as exc:
        raise TooLarge(str(exc), field=field) from None
    except UnidentifiedImageError:
        expected = formats[0] if mime else "PNG, JPEG, WEBP or GIF"
        raise InvalidRequest(f"the data is not a valid {expected} image", field=field) from None
    except (OSError, SyntaxError, ValueError, EOFError) as exc:
        raise InvalidRequest(f"the image is corrupt ({_reason(exc)})", field=field) from None
    factor = limits.vision_factor
    height, width = _resized(
        rgb.height, rgb.width, factor, limits.image_min_pixels, limits.image_max_pixels, field
    )
    tally.add_bytes(height * width * 3, field)
    pixels = np.array(rgb.resize((width, height), Image.Resampling.BICUBIC), dtype=np.uint8)
    return ImageInput(pixels)


# --- video ----------------------------------------------------------------------------------------
def decode_video(
    data: bytes,
    mime: str,
    field: str,
    tally: Tally,
    limits: MediaLimits,
    deadline: Deadline,
    with_audio: bool,
) -> VideoInput:
    demuxer = _demuxer(mime, VIDEO_DEMUXERS, "video", field)
    with _container(data, demuxer, VIDEO_DEMUXERS, field) as container:
        if not container.streams.video:
            raise InvalidRequest("the file has no video track", field=field)
        stream = container.streams.video[0]
        rate = float(stream.average_rate or stream.guessed_rate or 0)
        declared = _declared_seconds(container, stream)
        if not rate or not declared:
            raise InvalidRequest("the video states no frame rate or duration", field=field)
        if declared > limits.max_video_seconds:
            raise TooLarge(
                f"the video lasts {declared:.1f} s; at most {limits.max_video_seconds:g} are accepted "
                "(the gateway's max_video_seconds)",
                field=field,
            )
        if with_audio:
            if not container.streams.audio:
                raise InvalidRequest("use_audio_in_video needs a video with a sound track", field=field)
            tally.check_audio_duration(declared, field)
        _check_pixels(stream.codec_context.width, stream.codec_context.height, limits, field)
        total = stream.frames or max(1, round(declared * rate))
        try:
            nframes = smart_nframes(total, rate, limits)
        except ValueError as exc:
            raise InvalidRequest(str(exc), field=field) from None
        frames = _sampled_frames(container, stream, total, nframes, field, tally, limits, deadline)
        sample_fps = nframes / total * rate
    audio = None
    if with_audio:
        with _container(data, demuxer, VIDEO_DEMUXERS, field) as container:
            samples = _read_audio(container, container.streams.audio[0], field, tally, deadline)
        if not samples.size:
            raise InvalidRequest("the video's sound track is empty", field=field)
        audio = AudioInput(samples)
    return VideoInput(frames, sample_fps, audio)


def _sampled_frames(
    container: av.container.InputContainer,
    stream: av.video.stream.VideoStream,
    total: int,
    nframes: int,
    field: str,
    tally: Tally,
    limits: MediaLimits,
    deadline: Deadline,
) -> np.ndarray:
    """Decode once, keeping the frames at the sampled indices, resized as they come."""
    wanted = frame_indices(total, nframes)
    keep = set(wanted)
    kept: dict[int, np.ndarray] = {}
    size: tuple[int, int] | None = None
    index = -1
    try:
        for packet in container.demux(stream):
            deadline.check(field)
            for frame in packet.decode():
                index += 1
                if frame.time is not None and frame.time > limits.max_video_seconds:
                    raise TooLarge(
                        f"the video runs past {limits.max_video_seconds:g} s "
                        "(the gateway's max_video_seconds)",
                        field=field,
                    )
                if index not in keep:
                    continue
                image: Image.Image = frame.to_image()  # type: ignore[no-untyped-call]  # PyAV's stub: untyped
                if size is None:
                    _check_pixels(image.width, image.height, limits, field)
                    size = _resized(
                        image.height,
                        image.width,
                        limits.vision_factor,
                        limits.video_min_pixels,
                        limits.video_frame_max_pixels(nframes),
                        field,
                    )
                    tally.add_bytes(nframes * size[0] * size[1] * 3, field)
                kept[index] = np.asarray(image.resize((size[1], size[0]), Image.Resampling.BICUBIC))
            if index >= wanted[-1]:
                break
    except (av.FFmpegError, ValueError) as exc:
        raise InvalidRequest(f"the video is corrupt ({_reason(exc)})", field=field) from None
    if not kept:
        raise InvalidRequest("the video has no decodable frames", field=field)
    if index + 1 < 0.9 * total - 1 and stream.frames:
        raise InvalidRequest(
            f"the file is truncated: it declares {total} frames but holds {index + 1}", field=field
        )
    # A frame count that was only estimated may run short: the last frame fills in, as the
    # reference pads a frame list to an even length.
    return np.stack([kept[max((k for k in kept if k <= i), default=min(kept))] for i in wanted])
