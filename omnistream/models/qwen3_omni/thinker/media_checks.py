"""A chat's media checked before anything else reads them, and the processor call the reference makes.

Each item is refused here, naming it, if its type, shape, dtype, rate or size is wrong, so a bad item
never reaches a batch (the gateway has its own, usually tighter, limits).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnistream.models.qwen3_omni.thinker.finite_samples import FiniteSamples
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import AUDIO_SAMPLE_RATE, AudioInput, ImageInput, VideoInput, parts_of

# Media a single request may bring (the gateway has its own, usually tighter, limits).
MAX_AUDIO_SECONDS = 20 * 60
MAX_ITEMS = 64
MAX_PIXELS = 4096 * 4096
MAX_FRAMES = 2048
_FINITE = FiniteSamples()  # a conversation's re-sent spoken turns: checked once each


@dataclass
class Collected:
    images: list[np.ndarray] = field(default_factory=list)
    videos: list[np.ndarray] = field(default_factory=list)
    audio: list[np.ndarray] = field(default_factory=list)
    audio_slots: list[int | None] = field(default_factory=list)  # None: standalone, i: videos[i]
    fps: set[float] = field(default_factory=set)


def check_media(messages: Sequence[Mapping[str, Any]], use_audio_in_video: bool) -> Collected:
    """The media of a chat in prompt order, checked (types, shapes, dtypes, rates, sizes) so a bad
    item is refused here, naming it, and never reaches a batch."""
    got = Collected()
    for i, message in enumerate(messages):
        content = message.get("content", "")
        if not isinstance(content, str) and not isinstance(content, Sequence):
            raise InvalidRequest(
                f"messages[{i}].content must be a string or a list of parts", field="messages"
            )
        for j, part in enumerate(parts_of(content)):
            where = f"messages[{i}].content[{j}]"
            if not isinstance(part, Mapping):
                raise InvalidRequest(f"{where} must be a part ({{'type': ...}})", field="messages")
            kind = part.get("type")
            if kind == "text":
                if not isinstance(part.get("text"), str):
                    raise InvalidRequest(f"{where}.text must be a string", field="messages")
            elif kind == "audio":
                got.audio.append(_audio(part.get("audio"), f"{where}.audio"))
                got.audio_slots.append(None)
            elif kind == "image":
                got.images.append(_image(part.get("image"), f"{where}.image"))
            elif kind == "video":
                video = part.get("video")
                if not isinstance(video, VideoInput):
                    raise InvalidRequest(f"{where}.video must be a video", field="messages")
                got.videos.append(_frames(video.frames, f"{where}.video.frames"))
                if not (np.isfinite(video.fps) and 0 < video.fps <= 240):
                    raise InvalidRequest(f"{where}.video.fps must be in (0, 240]", field="messages")
                got.fps.add(float(video.fps))
                if use_audio_in_video:
                    if video.audio is None:
                        # The reference places every video's sound by the frames; it has no silent case.
                        raise InvalidRequest(
                            f"{where}.video has no audio but use_audio_in_video is set", field="messages"
                        )
                    got.audio.append(_audio(video.audio, f"{where}.video.audio"))
                    got.audio_slots.append(len(got.videos) - 1)
            else:
                raise InvalidRequest(f"{where}.type must be text, audio, image or video", field="messages")
    if len(got.images) + len(got.videos) + len(got.audio) > MAX_ITEMS:
        raise InvalidRequest(f"a request may bring at most {MAX_ITEMS} media items", field="messages")
    if len(got.fps) > 1:
        # The processor times every video of a prompt by one frame rate.
        raise InvalidRequest("all videos of a request must have the same fps", field="messages")
    return got


def _audio(audio: Any, where: str) -> np.ndarray:
    if not isinstance(audio, AudioInput):
        raise InvalidRequest(f"{where} must be audio", field="messages")
    if audio.sample_rate != AUDIO_SAMPLE_RATE:
        raise InvalidRequest(f"{where}.sample_rate must be {AUDIO_SAMPLE_RATE}", field="messages")
    samples = audio.samples
    if not isinstance(samples, np.ndarray) or samples.dtype != np.float32 or samples.ndim != 1:
        raise InvalidRequest(f"{where}.samples must be float32 of shape [n]", field="messages")
    if not 0 < samples.size <= MAX_AUDIO_SECONDS * AUDIO_SAMPLE_RATE:
        raise InvalidRequest(f"{where} must be 1 sample to {MAX_AUDIO_SECONDS} s long", field="messages")
    if not _FINITE.finite(samples):
        raise InvalidRequest(f"{where}.samples hold NaN or infinite values", field="messages")
    return samples


def _image(image: Any, where: str) -> np.ndarray:
    if not isinstance(image, ImageInput):
        raise InvalidRequest(f"{where} must be an image", field="messages")
    pixels = image.pixels
    if (
        not isinstance(pixels, np.ndarray)
        or pixels.dtype != np.uint8
        or pixels.ndim != 3
        or pixels.shape[2] != 3
    ):
        raise InvalidRequest(f"{where}.pixels must be uint8 of shape [height, width, 3]", field="messages")
    if not 0 < pixels.shape[0] * pixels.shape[1] <= MAX_PIXELS:
        raise InvalidRequest(f"{where} must have 1 to {MAX_PIXELS} pixels", field="messages")
    return pixels


def _frames(frames: Any, where: str) -> np.ndarray:
    if (
        not isinstance(frames, np.ndarray)
        or frames.dtype != np.uint8
        or frames.ndim != 4
        or frames.shape[3] != 3
    ):
        raise InvalidRequest(f"{where} must be uint8 of shape [frames, height, width, 3]", field="messages")
    if not 0 < frames.shape[0] <= MAX_FRAMES or not 0 < frames.shape[1] * frames.shape[2] <= MAX_PIXELS:
        raise InvalidRequest(
            f"{where}: 1 to {MAX_FRAMES} frames of 1 to {MAX_PIXELS} pixels", field="messages"
        )
    return frames


def processor_inputs(rendered: str, media: Collected, use_audio_in_video: bool) -> dict[str, Any]:
    """The processor call the reference makes for these arrays (tests call it for the reference)."""
    kwargs: dict[str, Any] = {"text": [rendered], "return_tensors": "pt"}
    if media.images:
        kwargs["images"] = list(media.images)
    if media.videos:
        kwargs["videos"] = list(media.videos)
        kwargs["videos_kwargs"] = {"fps": next(iter(media.fps))}
    if media.audio:
        kwargs["audio"] = list(media.audio)
    if use_audio_in_video and media.videos:
        kwargs["load_audio_from_video"] = True
        kwargs["audio_from_video_indices"] = list(media.audio_slots)
    return kwargs
