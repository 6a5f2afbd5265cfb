"""WAV files: 32-bit float for archives, 16-bit PCM for clients that want it."""

from __future__ import annotations

import io
import struct
import wave
from pathlib import Path

import numpy as np


def float32_wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    """IEEE-float WAV (format 3), which the `wave` module cannot write."""
    data = np.asarray(audio, dtype="<f4").tobytes()
    fmt = struct.pack("<HHIIHH", 3, 1, sample_rate, sample_rate * 4, 4, 32)
    fact = struct.pack("<I", len(audio))
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"fact" + struct.pack("<I", 4) + fact + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def write_float32_wav(path: str | Path, audio: np.ndarray, sample_rate: int) -> None:
    Path(path).write_bytes(float32_wav_bytes(audio, sample_rate))


def to_pcm16(audio: np.ndarray) -> bytes:
    pcm: np.ndarray = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")
    return pcm.tobytes()


def pcm16_wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(to_pcm16(audio))
    return buf.getvalue()


def read_float32_wav(path: str | Path) -> tuple[np.ndarray, int]:
    raw = Path(path).read_bytes()
    if raw[:4] != b"RIFF" or raw[8:12] != b"WAVE":
        raise ValueError("not a WAV file")
    pos, rate, data = 12, 0, None
    while pos + 8 <= len(raw):
        tag, size = raw[pos : pos + 4], struct.unpack("<I", raw[pos + 4 : pos + 8])[0]
        chunk = raw[pos + 8 : pos + 8 + size]
        if tag == b"fmt ":
            fmt, _, rate = struct.unpack("<HHI", chunk[:8])
            if fmt != 3:
                raise ValueError("not a float WAV")
        elif tag == b"data":
            data = np.frombuffer(chunk, dtype="<f4").copy()
        pos += 8 + size + (size & 1)
    if data is None:
        raise ValueError("WAV has no data chunk")
    return data, rate
