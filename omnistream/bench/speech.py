"""Spoken input for the realtime benchmark and tests: espeak-ng renders a sentence, kept as pcm16
mono 24 kHz (the Realtime API's format) under a cache directory, so each is rendered once."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import soundfile  # type: ignore[import-untyped]  # no stubs

RATE = 24000
CACHE = Path(".cache") / "speech"


def speech_pcm16(text: str, voice: str = "en", cache: Path = CACHE) -> bytes:
    """`text` spoken by espeak-ng, as pcm16 24 kHz bytes (resampled with linear interpolation)."""
    key = hashlib.sha256(f"{voice}\0{text}".encode()).hexdigest()[:16]
    path = cache / f"{key}.pcm"
    if path.exists():
        return path.read_bytes()
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-w", str(wav), text], check=True, capture_output=True)
        samples, rate = soundfile.read(wav, dtype="float32")
    if samples.ndim > 1:
        samples = samples.mean(axis=1)
    n = round(samples.size * RATE / rate)
    resampled = np.interp(np.arange(n) * rate / RATE, np.arange(samples.size), samples)
    pcm: bytes = (np.clip(resampled, -1.0, 1.0) * 32767).round().astype("<i2").tobytes()
    cache.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")  # whole or absent to a parallel reader
    staging.write_bytes(pcm)
    os.replace(staging, path)
    return pcm


def silence_pcm16(seconds: float) -> bytes:
    return bytes(2 * round(seconds * RATE))


def until(pcm: bytes, seconds: float) -> bytes:
    """`pcm` followed by silence up to `seconds` in all (as it is if it is that long already)."""
    return pcm + silence_pcm16(seconds)[len(pcm) :]


def pieces(pcm: bytes, ms: int = 20) -> list[bytes]:
    """`pcm` cut into `ms` pieces, as a microphone would send it."""
    size = RATE * ms // 1000 * 2
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]
