"""The audio formats on the realtime wire: pcm16 at 24 kHz, and G.711 (mu-law, A-law) at 8 kHz,
what telephone bridges (Twilio's media streams) send and expect.

Why convert at the edge: inside, a session's audio stays pcm16 at 24 kHz whatever the wire's format
(the input buffer, the VAD's sample positions, the `audio_*_ms` fields, the truncation of an
answer), so G.711 only changes what an append is decoded into and what a delta is encoded from.
G.711 is the standard library's `audioop` (its backport `audioop-lts` from Python 3.13, where the
module left the standard library: pyproject names it for those versions); the rate changes are
FFmpeg's resampler (PyAV), the one the gateway uses everywhere else, which keeps its state across
chunks, so a stream cut into appends or deltas is resampled as one (no clicks at the joins).
G.711 is one byte a sample, so every delta is whole samples.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import av
import numpy as np

from gateway.realtime.vad import INPUT_RATE

with warnings.catch_warnings():  # deprecated in 3.11/3.12 (removed in 3.13: audioop-lts then)
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

G711_RATE = 8000


@dataclass(frozen=True)
class AudioFormat:
    """One wire format: its GA `type` and beta name, its rate and bytes per sample."""

    type: str
    beta: str
    rate: int
    sample_bytes: int

    def wire(self) -> dict[str, Any]:
        """As GA's session.created / session.updated show it (OpenAI's schema: only pcm has a rate;
        beta shows the `beta` name)."""
        return {"type": self.type, "rate": self.rate} if self.type == "audio/pcm" else {"type": self.type}

    def samples(self, size: int) -> int:
        """Samples of the session's 24 kHz stream that `size` bytes of this format stand for."""
        return size // self.sample_bytes * INPUT_RATE // self.rate

    def bytes_for(self, stream_bytes: int) -> int:
        """Bytes of this format that `stream_bytes` of pcm16 24 kHz are (a size limit in this format)."""
        return stream_bytes // 2 * self.rate // INPUT_RATE * self.sample_bytes


PCM16 = AudioFormat("audio/pcm", "pcm16", INPUT_RATE, 2)
PCMU = AudioFormat("audio/pcmu", "g711_ulaw", G711_RATE, 1)
PCMA = AudioFormat("audio/pcma", "g711_alaw", G711_RATE, 1)
FORMATS = {f.type: f for f in (PCM16, PCMU, PCMA)} | {f.beta: f for f in (PCM16, PCMU, PCMA)}


def resampler(rate: int) -> av.AudioResampler:
    """FFmpeg's resampler to pcm16 mono at `rate`; it keeps its state from one chunk to the next."""
    return av.AudioResampler(format="s16", layout="mono", rate=rate)


def resample(resampler: av.AudioResampler, frame: av.AudioFrame | None) -> bytes:
    """`frame` through `resampler` as pcm16 bytes (None: flush what it holds)."""
    return b"".join(bytes(out.to_ndarray().astype("<i2").tobytes()) for out in resampler.resample(frame))


def mono_frame(samples: np.ndarray, fmt: str, rate: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format=fmt, layout="mono")
    frame.sample_rate = rate
    return frame


class InputDecoder:
    """A session's appends in its input format -> pcm16 24 kHz, continuous across appends."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._resampler = resampler(INPUT_RATE) if fmt.rate != INPUT_RATE else None

    def decode(self, data: bytes) -> bytes:
        if self._resampler is None:
            return data
        linear = audioop.ulaw2lin(data, 2) if self.format is PCMU else audioop.alaw2lin(data, 2)
        return resample(self._resampler, mono_frame(np.frombuffer(linear, "<i2"), "s16", self.format.rate))


def encode_g711(fmt: AudioFormat, pcm: bytes) -> bytes:
    """pcm16 at 8 kHz -> `fmt`'s bytes (pcm16 unchanged)."""
    if fmt is PCMU:
        return audioop.lin2ulaw(pcm, 2)
    if fmt is PCMA:
        return audioop.lin2alaw(pcm, 2)
    return pcm
