"""Generated media for tests (no downloads): sine/noise audio, synthetic images and frames, and the
conversations the multimodal parity tests run, plus the reference's processor call for them."""

from __future__ import annotations

from typing import Any

import numpy as np

from omnistream.request.media import AUDIO_SAMPLE_RATE, AudioInput, ImageInput, VideoInput


def tone(seconds: float, hz: float = 440.0, seed: int = 0) -> AudioInput:
    t = np.arange(int(seconds * AUDIO_SAMPLE_RATE)) / AUDIO_SAMPLE_RATE
    noise = np.random.default_rng(seed).standard_normal(t.size) * 0.02
    return AudioInput((0.3 * np.sin(2 * np.pi * hz * t) + noise).astype(np.float32))


def image(height: int = 16, width: int = 24, seed: int = 0) -> ImageInput:
    """A gradient with noise, sized to multiples of the tiny model's resize factor (8)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) % 256], -1)
    return ImageInput(np.clip(base + rng.integers(-20, 20, base.shape), 0, 255).astype(np.uint8))


def video(frames: int = 4, size: int = 16, fps: float = 2.0, audio_seconds: float | None = 2.0) -> VideoInput:
    clip = np.stack([image(size, size, seed=i).pixels for i in range(frames)])
    sound = tone(audio_seconds, hz=220.0, seed=7) if audio_seconds else None
    return VideoInput(clip, fps, sound)


def conversations() -> dict[str, tuple[list[dict[str, Any]], bool]]:
    """name -> (messages, use_audio_in_video)."""
    return {
        "audio": (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "audio", "audio": tone(1.3)},
                        {"type": "text", "text": "What is this sound?"},
                    ],
                }
            ],
            False,
        ),
        "image": (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": image()},
                        {"type": "text", "text": "Tell me about it."},
                    ],
                }
            ],
            False,
        ),
        "video_with_sound": (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "video", "video": video()},
                        {"type": "text", "text": "What happens?"},
                    ],
                }
            ],
            True,
        ),
        "video_no_sound": (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look:"},
                        {"type": "video", "video": video(5, 16, fps=2.0, audio_seconds=None)},
                    ],
                }
            ],
            False,
        ),
        "mixed_turns": (
            [
                {"role": "system", "content": "You are a helpful assistant."},
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "image": image(24, 16, seed=3)},
                        {"type": "text", "text": "Hello, what is this?"},
                    ],
                },
                {"role": "assistant", "content": "It is a picture."},
                {
                    "role": "user",
                    "content": [
                        {"type": "audio", "audio": tone(0.7, hz=330.0, seed=2)},
                        {"type": "video", "video": video(3, 8, fps=1.0, audio_seconds=None)},
                        {"type": "text", "text": "and this?"},
                    ],
                },
            ],
            False,
        ),
    }
