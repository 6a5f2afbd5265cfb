"""Speech audio in the formats of OpenAI's speech API, encoded as it is decoded (torch-free).

Every format has one streaming encoder: `write` takes the next float32 samples and returns the bytes
ready so far, `close` returns the rest. A whole file is the same encoder run over all the samples,
so the streamed bytes and a whole answer are the same codec path.

* pcm: raw 16-bit little-endian mono at the model's rate (24 kHz), as OpenAI's `pcm`.
* wav: a 16-bit PCM WAV. Streamed, the header comes first with its sizes at their maximum (the
  length is not known yet, as streaming servers do); whole, it has the real sizes.
* flac, mp3, aac, opus: encoded by FFmpeg through PyAV (a maintained binding), at 24 kHz mono, no
  resampling: libopus and LAME (MPEG-2 layer III) both take 24 kHz. opus is Ogg Opus, mp3 is raw
  MPEG audio, aac is ADTS, flac is native FLAC. A streamed flac cannot go back to write its
  sample count and checksum into the header, so those stay 0 ("unknown"), which FLAC allows.

Encoding is CPU work; the REST layer runs `write`/`close` in a worker thread, one call at a time.
"""

from __future__ import annotations

import io
import struct
from typing import Literal, Protocol

import numpy as np

from omnistream.audio.wav import pcm16_wav_bytes, to_pcm16

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")

MEDIA_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}

# Ogg pages are written when full, by default about a second of audio: a short page keeps a streamed
# opus answer flowing as it is decoded (one 20 ms packet per page at most costs ~27 bytes each).
_MUXER_OPTIONS = {"ogg": {"page_duration": "20000"}}
# format -> (FFmpeg muxer, FFmpeg encoder, bit rate or None for lossless)
# format -> (muxer, encoder, bit rate); the encoders are PyAV's audio codec names, so its stubs
# type the stream `add_stream` makes as an AudioStream.
_CODECS: dict[str, tuple[str, Literal["libmp3lame", "libopus", "aac", "flac"], int | None]] = {
    "mp3": ("mp3", "libmp3lame", 64_000),
    "opus": ("ogg", "libopus", 48_000),
    "aac": ("adts", "aac", 64_000),
    "flac": ("flac", "flac", None),
}


class AudioEncoder(Protocol):
    def write(self, samples: np.ndarray) -> bytes:
        """Encode the next mono float32 samples in [-1, 1]; the bytes ready so far."""
        ...

    def close(self) -> bytes:
        """Flush the encoder; the remaining bytes (the file is complete after them)."""
        ...


def wav_stream_header(sample_rate: int) -> bytes:
    """A WAV header for a stream of unknown length (sizes at their maximum, as streaming servers do)."""
    fmt = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    return (
        b"RIFF"
        + struct.pack("<I", 0xFFFFFFFF)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", 16)
        + fmt
        + b"data"
        + struct.pack("<I", 0xFFFFFFFF)
    )


class PcmEncoder:
    """Raw 16-bit LE samples; with `wav_header`, a streaming WAV header goes first."""

    def __init__(self, sample_rate: int, wav_header: bool = False) -> None:
        self._header = wav_stream_header(sample_rate) if wav_header else b""

    def write(self, samples: np.ndarray) -> bytes:
        out, self._header = self._header + to_pcm16(samples), b""
        return out

    def close(self) -> bytes:
        out, self._header = self._header, b""  # an empty stream is still a (header-only) WAV
        return out


class _Sink:
    """Where a streaming muxer writes: bytes taken as they come. No `seek`, so FFmpeg writes a
    stream it never goes back into (the bytes already left)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def write(self, data: bytes) -> int:
        self._buf += data
        return len(data)

    def flush(self) -> None:
        pass

    def take(self) -> bytes:
        out = bytes(self._buf)
        self._buf.clear()
        return out


class _Whole(io.BytesIO):
    """Where a whole-file muxer writes: seekable, so FFmpeg completes its headers at the end (a
    FLAC's sample count and checksum, which readers such as libsndfile rely on)."""

    def take(self) -> bytes:
        return b""  # nothing leaves before the end

    def whole(self) -> bytes:
        return self.getvalue()


class CodecEncoder:
    """flac, mp3, aac or opus through PyAV, muxed as it encodes: into a non-seekable sink when
    streaming, else into memory (see `_Whole`). FLAC is fed the very 16-bit samples `pcm` sends,
    so it decodes to them exactly; the lossy codecs take float32."""

    def __init__(self, fmt: str, sample_rate: int, whole: bool = False) -> None:
        import av  # only where compressed formats are asked for

        muxer, codec, bit_rate = _CODECS[fmt]
        self._sink: _Sink | _Whole = _Whole() if whole else _Sink()
        self._container = av.open(self._sink, mode="w", format=muxer, options=_MUXER_OPTIONS.get(muxer))
        self._pcm16 = fmt == "flac"
        self._stream = self._container.add_stream(codec, rate=sample_rate, layout="mono")
        if bit_rate is not None:
            self._stream.codec_context.bit_rate = bit_rate
        self._rate = sample_rate
        self._pts = 0
        self._closed = False

    def write(self, samples: np.ndarray) -> bytes:
        import av

        if self._pcm16:
            data = np.frombuffer(to_pcm16(samples), dtype="<i2").reshape(1, -1)
        else:
            data = np.ascontiguousarray(np.clip(samples, -1.0, 1.0), dtype=np.float32).reshape(1, -1)
        if data.shape[1]:
            frame = av.AudioFrame.from_ndarray(data, format="s16" if self._pcm16 else "flt", layout="mono")
            frame.sample_rate = self._rate
            frame.pts = self._pts
            self._pts += data.shape[1]
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        return self._sink.take()

    def close(self) -> bytes:
        if not self._closed:
            self._closed = True
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
        return self._sink.take()

    def whole(self) -> bytes:
        """After `close`, for an encoder made with `whole=True`: the complete file."""
        assert isinstance(self._sink, _Whole) and self._closed
        return self._sink.whole()


def encoder(fmt: str, sample_rate: int) -> AudioEncoder:
    if fmt == "pcm":
        return PcmEncoder(sample_rate)
    if fmt == "wav":
        return PcmEncoder(sample_rate, wav_header=True)
    if fmt in _CODECS:
        return CodecEncoder(fmt, sample_rate)
    raise ValueError(f"unknown audio format {fmt!r}; one of {FORMATS}")


def encode_whole(fmt: str, samples: np.ndarray, sample_rate: int) -> bytes:
    """A complete file of `samples` (a WAV with its real sizes)."""
    if fmt == "wav":
        return pcm16_wav_bytes(samples, sample_rate)
    if fmt == "pcm":
        return to_pcm16(samples)
    enc = CodecEncoder(fmt, sample_rate, whole=True)
    enc.write(samples)
    enc.close()
    return enc.whole()
