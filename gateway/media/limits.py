"""The gateway's limits on media in one request, and the running tally that enforces them.

Why a budget of decoded bytes: decoded media reach the thinker inside one gRPC message (the
ThinkerOpen), next to the prompt text, so what can be decoded per request must fit that message.
A compressed file says little about its decoded size (a minute of mp3 is ~1 MB, of 16 kHz float32
3.8 MB; a 100 KB png may be 100 megapixels), so the tally counts what decoding produces, as it
produces it, and stops a decode the moment a limit is passed rather than after the whole file.

The defaults follow Qwen's reference preprocessing (qwen-omni-utils / qwen-vl-utils `fetch_image`,
`fetch_video`) where it fits the 16 MiB message, and are tighter where it does not: the reference
allows up to 16384 visual tokens per image (50 MB of pixels), here 1280 (3.9 MB).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from omnistream.request.errors import TooLarge
from omnistream.request.media import AUDIO_SAMPLE_RATE

AUDIO_BYTES_PER_SECOND = AUDIO_SAMPLE_RATE * 4  # float32 mono
# Qwen3-Omni's vision encoder: patch_size 16 x spatial_merge_size 2. Resized sides are multiples of
# it (the tiny test model's 4 x 2 divides it, so its images fit that model too).
VISION_FACTOR = 32
# The reference's constants (qwen_vl_utils.vision_process), in visual tokens of VISION_FACTOR^2 pixels.
IMAGE_MIN_TOKENS = 4
VIDEO_MIN_TOKENS = 128
VIDEO_MAX_TOKENS = 768
FRAME_FACTOR = 2  # frames go in pairs (temporal_patch_size 2)
VIDEO_MIN_FRAMES = 4


@dataclass(frozen=True)
class MediaLimits:
    """Everything that bounds one request's media (see `GatewayConfig` for each default's reason)."""

    max_media_bytes: int = 5 * 1024 * 1024
    max_decoded_bytes: int = 12 * 1024 * 1024
    max_audio_seconds: float = 180.0
    max_image_input_pixels: int = 36_000_000
    image_max_pixels: int = 1280 * VISION_FACTOR**2
    max_video_seconds: float = 120.0
    max_video_frames: int = 16
    video_fps: float = 2.0
    video_total_pixels: int = 1_572_864
    vision_factor: int = VISION_FACTOR
    decode_timeout: float = 30.0
    decode_workers: int = 2
    url_prefixes: tuple[str, ...] = ()
    url_timeout: float = 10.0

    @classmethod
    def of(cls, config: Any) -> MediaLimits:
        """A gateway config's limits (duck-typed, so this module does not import the config)."""
        return cls(
            max_media_bytes=config.max_media_bytes,
            max_decoded_bytes=config.max_decoded_media_bytes,
            max_audio_seconds=config.max_audio_seconds,
            max_image_input_pixels=config.max_image_input_pixels,
            image_max_pixels=config.image_max_pixels,
            max_video_seconds=config.max_video_seconds,
            max_video_frames=config.max_video_frames,
            video_fps=config.video_fps,
            video_total_pixels=config.video_total_pixels,
            vision_factor=config.vision_factor,
            decode_timeout=config.media_decode_timeout,
            decode_workers=config.media_decode_workers,
            url_prefixes=tuple(config.media_url_prefixes),
            url_timeout=config.media_url_timeout,
        )

    @property
    def image_min_pixels(self) -> int:
        return IMAGE_MIN_TOKENS * self.vision_factor**2

    @property
    def video_min_pixels(self) -> int:
        return VIDEO_MIN_TOKENS * self.vision_factor**2

    def video_frame_max_pixels(self, nframes: int) -> int:
        """The reference's per-frame pixel budget for a video sampled to `nframes` frames
        (`fetch_video`: max(min(768 tokens, total_pixels / nframes * 2), 1.05 * min_pixels))."""
        per_frame = self.video_total_pixels / nframes * FRAME_FACTOR
        ceiling = min(VIDEO_MAX_TOKENS * self.vision_factor**2, per_frame)
        return int(max(ceiling, int(self.video_min_pixels * 1.05)))

    def worst_case_bytes(self) -> dict[str, int]:
        """The most decoded bytes each limit lets one item produce (for the config's checks)."""
        video = max(
            n * self.video_frame_max_pixels(n) * 3
            for n in range(FRAME_FACTOR, max(self.max_video_frames, FRAME_FACTOR) + 1, FRAME_FACTOR)
        )
        return {
            "max_audio_seconds": math.ceil(self.max_audio_seconds * AUDIO_BYTES_PER_SECOND),
            "image_max_pixels": self.image_max_pixels * 3,
            "max_video_frames": video,
        }

    def validate(self) -> None:
        positive = {
            "max_media_bytes": self.max_media_bytes,
            "max_decoded_media_bytes": self.max_decoded_bytes,
            "max_audio_seconds": self.max_audio_seconds,
            "max_image_input_pixels": self.max_image_input_pixels,
            "image_max_pixels": self.image_max_pixels,
            "max_video_seconds": self.max_video_seconds,
            "video_fps": self.video_fps,
            "video_total_pixels": self.video_total_pixels,
            "vision_factor": self.vision_factor,
            "media_decode_timeout": self.decode_timeout,
            "media_decode_workers": self.decode_workers,
            "media_url_timeout": self.url_timeout,
        }
        for name, value in positive.items():
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be positive")
        if self.max_video_frames < FRAME_FACTOR or self.max_video_frames % FRAME_FACTOR:
            raise ValueError(f"max_video_frames must be an even number >= {FRAME_FACTOR}")
        if self.image_max_pixels < self.image_min_pixels:
            raise ValueError(f"image_max_pixels must be at least {self.image_min_pixels} (4 visual tokens)")
        for prefix in self.url_prefixes:
            if not prefix.startswith(("http://", "https://", "file://")):
                raise ValueError(f"media_url_prefixes: {prefix!r} is not an http(s):// or file:// prefix")
        for name, size in self.worst_case_bytes().items():
            if size > self.max_decoded_bytes:
                raise ValueError(
                    f"{name} allows {size} decoded bytes in one item, over max_decoded_media_bytes "
                    f"({self.max_decoded_bytes})"
                )


class Tally:
    """One request's running totals; each `add_*` raises `TooLarge` (naming `field`) as soon as a
    limit is passed, so a decoder calls it as output appears and stops there."""

    def __init__(self, limits: MediaLimits) -> None:
        self.limits = limits
        self.decoded_bytes = 0
        self.audio_seconds = 0.0

    def add_bytes(self, n: int, field: str) -> None:
        self.decoded_bytes += n
        if self.decoded_bytes > self.limits.max_decoded_bytes:
            raise TooLarge(
                f"the request's media decode to over {self.limits.max_decoded_bytes} bytes "
                "(the gateway's max_decoded_media_bytes)",
                field=field,
            )

    def add_audio(self, samples: int, field: str) -> None:
        """`samples` more 16 kHz samples: seconds first (the clearer error), then bytes."""
        self.audio_seconds += samples / AUDIO_SAMPLE_RATE
        if self.audio_seconds > self.limits.max_audio_seconds:
            raise TooLarge(
                f"the request has over {self.limits.max_audio_seconds:g} seconds of audio "
                "(the gateway's max_audio_seconds)",
                field=field,
            )
        self.add_bytes(samples * 4, field)

    def check_audio_duration(self, seconds: float, field: str) -> None:
        """Refuse up front when a container declares a duration that cannot fit."""
        if self.audio_seconds + seconds > self.limits.max_audio_seconds + 0.5:  # containers round
            raise TooLarge(
                f"the audio lasts {seconds:.1f} s; the request may have at most "
                f"{self.limits.max_audio_seconds:g} seconds of audio (the gateway's max_audio_seconds)",
                field=field,
            )
