"""Spoken input for the realtime benchmarks and tests: espeak-ng renders a sentence, kept as pcm16
mono 24 kHz (the Realtime API's format) under a cache directory, so each is rendered once; an
utterance of about a given length (`utterance`: the voice-to-voice bench's)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
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


# Words for utterances of a given length (`utterance`): espeak-ng says about 3.2 a second.
PASSAGE = (
    "Hello, I am planning a small trip to the mountains next weekend with a few friends from work. "
    "We will probably drive, and the road takes about four hours each way. What should we pack if the "
    "nights are going to be quite cold, and is there anything we should not forget? One of us is "
    "vegetarian, so we need to plan the meals carefully, and I would also like to take some photos "
    "of the stars at night, if the sky is clear and the moon is not too bright."
)


@dataclass(frozen=True)
class Utterance:
    text: str
    pcm: bytes  # the speech alone, its silent ends trimmed

    @property
    def seconds(self) -> float:
        return len(self.pcm) / 2 / RATE


def trimmed(pcm: bytes, threshold: int = 100) -> bytes:
    """`pcm` without the near-silent samples (below `threshold`, about -50 dBFS) at either end."""
    samples = np.frombuffer(pcm, dtype="<i2")
    loud = np.nonzero(np.abs(samples.astype(np.int32)) > threshold)[0]
    return b"" if loud.size == 0 else samples[loud[0] : loud[-1] + 1].tobytes()


def _words(count: int) -> Utterance:
    text = " ".join(PASSAGE.split()[:count]).rstrip(",.?") + "."
    return Utterance(text, trimmed(speech_pcm16(text)))


def utterance(seconds: float) -> Utterance:
    """The prefix of PASSAGE (whole words) whose trimmed rendering is closest to `seconds`."""
    words = len(PASSAGE.split())
    count = max(1, min(words, round(seconds * 3.2)))  # espeak-ng: ~3.2 words a second
    best = _words(count)
    step = 1 if best.seconds < seconds else -1
    while 1 <= count + step <= words:
        nxt = _words(count + step)
        if abs(nxt.seconds - seconds) >= abs(best.seconds - seconds):
            break
        best, count = nxt, count + step
    if abs(best.seconds - seconds) > 0.5:
        raise ValueError(f"no prefix of the passage is spoken in about {seconds:g} s")
    return best


def dithered(pcm: bytes, seed: int) -> bytes:
    """`pcm` with +-1 LSB of seeded noise: inaudible, but audio no other turn sends."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
    noise = np.random.default_rng(seed).integers(-1, 2, samples.size)
    out: bytes = np.clip(samples + noise, -32768, 32767).astype("<i2").tobytes()
    return out
