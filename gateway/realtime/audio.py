"""Realtime audio on the wire: base64 pcm16 mono 24 kHz both ways, or G.711 at 8 kHz (formats.py).

In: a committed turn (or an `input_audio` part) is wrapped as a WAV file and handed to the
gateway's media decoder like any REST audio part, so it gets the same resampler (FFmpeg's, to the
thinker's 16 kHz), the same limits and the same worker threads, off the event loop.
A user audio item's samples end on a feature frame's boundary after a short digital silence
(`settled`): the model's audio features (Whisper's log-mel, which Qwen3-Omni takes: a 25 ms window
every 10 ms at 16 kHz) of an item followed by other, longer audio in the same prompt are computed
with zeros after it, and without them when it is the longest, so the same spoken turn would get
other features (and a frame more or less) once a longer turn followed it: its cached prefix would
no longer match, and every later turn would prefill it again. Ending it with a window of zeros on
a frame boundary makes both the same (checked against the feature extractor in the tests).
Out: the stages' float32 audio at the deployment's sample rate becomes the session's output format:
pcm16 at 24 kHz (Qwen3-Omni's code2wav is 24 kHz already), or G.711 at 8 kHz; any other rate goes
through FFmpeg's resampler, which keeps its state across chunks (gateway/realtime/formats.py).
"""

from __future__ import annotations

import base64
import binascii
import struct

import av
import numpy as np

from gateway.media.parts import EncodedMedia
from gateway.realtime.events import EventError
from gateway.realtime.formats import PCM16, AudioFormat, encode_g711, mono_frame, resample, resampler
from gateway.realtime.vad import INPUT_RATE
from omnistream.audio.wav import to_pcm16
from omnistream.request.media import AudioInput


def decode_base64_pcm(
    data: str, param: str, max_bytes: int, event_id: str | None, fmt: AudioFormat = PCM16
) -> bytes:
    """Base64 audio in `fmt` -> bytes, refusing more than `max_bytes` before decoding anything."""
    if len(data) * 3 // 4 > max_bytes:
        seconds = max_bytes / fmt.sample_bytes / fmt.rate
        raise EventError(
            f"the audio is over {max_bytes} bytes ({seconds:.1f} s of {fmt.beta} at {fmt.rate} Hz)",
            code="audio_too_large",
            param=param,
            event_id=event_id,
        )
    try:
        pcm = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise EventError(
            "the audio is not valid base64", code="invalid_value", param=param, event_id=event_id
        ) from None
    if len(pcm) % fmt.sample_bytes:
        raise EventError(
            "pcm16 audio has an even number of bytes", code="invalid_value", param=param, event_id=event_id
        )
    return pcm


def ms_of(samples: int) -> int:
    """Milliseconds of `samples` of the wire's 24 kHz audio (the events' `audio_*_ms` fields)."""
    return samples * 1000 // INPUT_RATE


FEATURE_HOP = 160  # samples per feature frame at 16 kHz (10 ms)
FEATURE_WINDOW = 400  # samples in one frame's window (25 ms)


def settled(audio: AudioInput) -> AudioInput:
    """The item's audio followed by at least a window of zeros, to a frame boundary (the module doc)."""
    samples = audio.samples
    length = -(-(samples.size + FEATURE_WINDOW) // FEATURE_HOP) * FEATURE_HOP
    padded = np.zeros(length, dtype=np.float32)
    padded[: samples.size] = samples
    return AudioInput(padded, audio.sample_rate)


WAV_HEADER = 44  # bytes of `wav_of`'s header


def wav_of(pcm: bytes, rate: int = INPUT_RATE) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(pcm)) + pcm
    return b"RIFF" + struct.pack("<I", len(body)) + body


def wav_size(pcm: bytes) -> int:
    """The bytes `wav_of(pcm)` takes: what a turn counts against the media byte limit."""
    return WAV_HEADER + len(pcm)


def encoded_turn(pcm: bytes, field: str) -> EncodedMedia:
    """A turn's pcm16 as the media decoder's input (a WAV file)."""
    return EncodedMedia("audio", "audio/wav", field, data=wav_of(pcm))


class OutputAudio:
    """Float chunks at the stage's rate -> the session's output format (pcm16 24 kHz, or G.711 at
    8 kHz), for one response: one resampler for all its chunks, so they join without a seam;
    `flush` at its end gives what the resampler's filter still holds."""

    def __init__(self, fmt: AudioFormat = PCM16) -> None:
        self.format = fmt
        self._resampler: av.AudioResampler | None = None
        self._rate: int | None = None

    def convert(self, audio: np.ndarray, rate: int) -> bytes:
        if rate == self.format.rate and self.format is PCM16:
            return to_pcm16(audio)
        if self._resampler is None or self._rate != rate:
            self._resampler = resampler(self.format.rate)
            self._rate = rate
        frame = mono_frame(np.clip(audio, -1.0, 1.0).astype(np.float32), "flt", rate)
        return encode_g711(self.format, resample(self._resampler, frame))

    def flush(self) -> bytes:
        if self._resampler is None:
            return b""
        return encode_g711(self.format, resample(self._resampler, None))
