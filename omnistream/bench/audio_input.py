"""The benchmark's spoken-input workload: a few seconds of speech-like sound in, text and speech out.

No recording ships with the project and nothing is downloaded, so the input is synthesised: a
voiced source (a fundamental near 120 Hz with harmonics, its pitch drifting as in speech) shaped
into about three syllables a second, plus a little noise. For the model's cost only the duration
matters (the audio encoder's work and the prompt's length follow it), not what is "said".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnistream.audio.wav import pcm16_wav_bytes
from omnistream.request.media import AUDIO_SAMPLE_RATE, AudioInput

QUESTION = "Answer what you heard."


def speech_like(seconds: float, rate: int = AUDIO_SAMPLE_RATE, seed: int = 0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    pitch = 120.0 + 30.0 * np.sin(2 * np.pi * 0.5 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voiced = sum((0.6 / k) * np.sin(k * phase) for k in range(1, 8))
    syllables = np.clip(np.sin(2 * np.pi * 3.0 * t) + 0.3, 0.0, None)
    noise = 0.02 * np.random.default_rng(seed).standard_normal(t.size)
    return np.clip(0.3 * voiced * syllables + noise, -1.0, 1.0).astype(np.float32)


def audio_message(seconds: float, encoded: bool) -> dict[str, Any]:
    """The workload's user turn: decoded (the in-process pipeline takes arrays) or as a WAV file (the
    gateway decodes what clients send)."""
    samples = speech_like(seconds)
    part: dict[str, Any]
    if encoded:
        part = {
            "type": "audio",
            "data": pcm16_wav_bytes(samples, AUDIO_SAMPLE_RATE),
            "mime_type": "audio/wav",
        }
    else:
        part = {"type": "audio", "audio": AudioInput(samples)}
    return {"role": "user", "content": [part, {"type": "text", "text": QUESTION}]}
