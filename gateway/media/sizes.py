"""The sizes Qwen's reference preprocessing gives media before the processor (qwen-omni-utils /
qwen-vl-utils, read, not imported): image sides and video frame counts. Pure arithmetic, kept apart
from the decoders so the rules can be checked against the reference's numbers on their own.
"""

from __future__ import annotations

import math

import numpy as np

from gateway.media.limits import FRAME_FACTOR, VIDEO_MIN_FRAMES, MediaLimits

MAX_ASPECT_RATIO = 200  # the reference's bound


def round_by_factor(number: float, factor: int) -> int:
    return round(number / factor) * factor


def ceil_by_factor(number: float, factor: int) -> int:
    return math.ceil(number / factor) * factor


def floor_by_factor(number: float, factor: int) -> int:
    return math.floor(number / factor) * factor


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The reference's `smart_resize`: sides that are multiples of `factor`, pixels within
    [min_pixels, max_pixels], aspect ratio kept as closely as that allows."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"the aspect ratio is over {MAX_ASPECT_RATIO}:1")
    h_bar = max(factor, round_by_factor(height, factor))
    w_bar = max(factor, round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, floor_by_factor(height / beta, factor))
        w_bar = max(factor, floor_by_factor(width / beta, factor))
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = ceil_by_factor(height * beta, factor)
        w_bar = ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def smart_nframes(total_frames: int, video_fps: float, limits: MediaLimits) -> int:
    """The reference's `smart_nframes` at `limits.video_fps`: an even count in [4, max_frames],
    never more than the video has."""
    min_frames = ceil_by_factor(VIDEO_MIN_FRAMES, FRAME_FACTOR)
    max_frames = floor_by_factor(min(limits.max_video_frames, total_frames), FRAME_FACTOR)
    nframes = total_frames / video_fps * limits.video_fps
    nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
    nframes = floor_by_factor(nframes, FRAME_FACTOR)
    if not FRAME_FACTOR <= nframes <= total_frames:
        raise ValueError(f"the video has {total_frames} frames; at least {FRAME_FACTOR} are needed")
    return nframes


def frame_indices(total_frames: int, nframes: int) -> list[int]:
    """Evenly spread, first and last included (`torch.linspace(0, total - 1, n).round()`)."""
    return [int(i) for i in np.linspace(0, total_frames - 1, nframes).round()]
