"""Media in a request, decoded: what the gateway makes of a client's files and the thinker takes.

Torch-free (numpy only), like the rest of the request model: the gateway decodes and checks media
before a request is admitted, so a corrupt or oversized file is a 4xx at the door and never reaches
a batch; the thinker receives arrays it only has to feature-extract.

A message's `content` is either a string (text only) or a list of parts, in order:

    {"type": "text", "text": str}
    {"type": "audio", "audio": AudioInput}
    {"type": "image", "image": ImageInput}
    {"type": "video", "video": VideoInput}
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

AUDIO_SAMPLE_RATE = 16000  # what the model's audio feature extractor (Whisper-style) takes
MEDIA_TYPES = ("audio", "image", "video")


@dataclass(frozen=True, eq=False)
class AudioInput:
    """Mono float32 samples in [-1, 1] at `sample_rate`."""

    samples: np.ndarray
    sample_rate: int = AUDIO_SAMPLE_RATE

    @property
    def seconds(self) -> float:
        return self.samples.size / self.sample_rate


def audio_digest(audio: AudioInput) -> bytes:
    """The SHA-256 that names `audio` on the wire (AudioPart.digest): its rate, then its samples
    as float32, so equal digests are equal audio as the thinker hears it."""
    samples = np.ascontiguousarray(audio.samples, dtype=np.float32).reshape(-1)
    return hashlib.sha256(int(audio.sample_rate).to_bytes(4, "little") + samples.tobytes()).digest()


@dataclass(frozen=True)
class AudioRef:
    """An audio part sent as its digest (AudioPart.digest): the thinker's kept copy stands in for it
    (omnistream/service/scope_audio.py) before anything else reads the messages."""

    digest: bytes
    sample_rate: int


@dataclass(frozen=True, eq=False)
class ImageInput:
    """RGB uint8 pixels, [height, width, 3]."""

    pixels: np.ndarray


@dataclass(frozen=True, eq=False)
class VideoInput:
    """RGB uint8 frames, [frames, height, width, 3], sampled at `fps`; `audio` is the sound track."""

    frames: np.ndarray
    fps: float
    audio: AudioInput | None = None


Media = AudioInput | ImageInput | VideoInput


def parts_of(content: str | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A message's content as parts (a string is one text part)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return list(content)


def media_of(messages: Sequence[Mapping[str, Any]] | None) -> Iterator[Media]:
    """Every media item of a conversation, in prompt order."""
    for message in messages or ():
        for part in parts_of(message["content"]):
            if part["type"] in MEDIA_TYPES:
                yield part[part["type"]]


def text_of(content: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of a message's content (media left out): for size checks and logs."""
    return "".join(p["text"] for p in parts_of(content) if p["type"] == "text")


def media_kinds(messages: Sequence[Mapping[str, Any]] | None) -> frozenset[str]:
    """The kinds of media a conversation holds ("audio", "image", "video"), encoded or decoded:
    what a thinker replica must take to serve it (gateway replica choice)."""
    return frozenset(
        part["type"]
        for message in messages or ()
        for part in parts_of(message["content"])
        if part["type"] in MEDIA_TYPES
    )


def has_media(messages: Sequence[Mapping[str, Any]] | None) -> bool:
    return next(media_of(messages), None) is not None


@dataclass(frozen=True)
class MediaLayout:
    """Where a prompt's media sit in M-RoPE terms (proto MediaLayout): with the prompt ids, what the
    talker needs to give its own prompt the model's 3-D positions. Empty for a text-only prompt."""

    image_grid_thw: tuple[tuple[int, int, int], ...] = ()
    video_grid_thw: tuple[tuple[int, int, int], ...] = ()
    video_second_per_grid: tuple[float, ...] = ()
    audio_feature_lengths: tuple[int, ...] = ()

    @property
    def has_vision(self) -> bool:
        return bool(self.image_grid_thw or self.video_grid_thw)
