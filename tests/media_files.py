"""Small media files made on the spot with PyAV and Pillow (nothing downloaded), for the decoding
tests and the gateway's bad-media battery."""

from __future__ import annotations

import io
from fractions import Fraction

import av
import numpy as np
from PIL import Image

# container, codec, sample format for each audio format the API documents
AUDIO_CODECS = {
    "wav": ("wav", "pcm_s16le", "s16"),
    "mp3": ("mp3", "libmp3lame", "s16p"),
    "ogg": ("ogg", "libopus", "s16"),
    "flac": ("flac", "flac", "s16"),
    "webm": ("webm", "libopus", "s16"),
    "m4a": ("ipod", "aac", "fltp"),
}


def tone(
    seconds: float, rate: int, channels: int = 1, freq: float = 440.0, silent: bool = False
) -> np.ndarray:
    """[channels, n] float32: a sine (a little louder on the left), or silence."""
    t = np.arange(round(seconds * rate)) / rate
    wave = np.zeros_like(t) if silent else 0.5 * np.sin(2 * np.pi * freq * t)
    return np.stack([wave * (1.0 - 0.2 * c) for c in range(channels)]).astype(np.float32)


def _audio_stream(container: av.container.OutputContainer, codec: str, rate: int, channels: int):
    return container.add_stream(codec, rate=rate, layout="mono" if channels == 1 else "stereo")


def _write_audio(
    container: av.container.OutputContainer, stream, fmt: str, pcm: np.ndarray, rate: int
) -> None:
    layout = "mono" if pcm.shape[0] == 1 else "stereo"
    frame_size = stream.codec_context.frame_size or 1024
    for start in range(0, pcm.shape[1], frame_size):
        block = pcm[:, start : start + frame_size]
        if fmt.startswith("s16"):
            block = (block * 32767).astype(np.int16)
        if not fmt.endswith("p"):
            block = block.T.reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(block), format=fmt, layout=layout)
        frame.sample_rate = rate
        frame.pts = start
        frame.time_base = Fraction(1, rate)
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)


def audio_file(
    kind: str, seconds: float = 1.0, rate: int = 44100, channels: int = 2, silent: bool = False
) -> bytes:
    container_format, codec, fmt = AUDIO_CODECS[kind]
    if codec == "libopus":
        rate = 48000  # the only rates opus takes are divisors of 48 kHz
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = _audio_stream(container, codec, rate, channels)
        _write_audio(container, stream, fmt, tone(seconds, rate, channels, silent=silent), rate)
    return buffer.getvalue()


def video_file(
    kind: str = "mp4",
    seconds: float = 2.0,
    fps: int = 10,
    size: tuple[int, int] = (64, 48),
    sound: bool = True,
) -> bytes:
    """A moving gradient (frame i is brighter than frame i-1) with, optionally, a sine sound track."""
    container_format, codec, audio_codec, audio_fmt = {
        "mp4": ("mp4", "libx264", "aac", "fltp"),
        "webm": ("webm", "libvpx", "libopus", "s16"),
    }[kind]
    width, height = size
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        audio_rate = 48000
        audio = _audio_stream(container, audio_codec, audio_rate, 2) if sound else None
        frames = round(seconds * fps)
        for i in range(frames):
            pixels = np.full((height, width, 3), int(255 * i / max(frames - 1, 1)), np.uint8)
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts = i
            frame.time_base = Fraction(1, fps)
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if audio is not None:
            _write_audio(container, audio, audio_fmt, tone(seconds, audio_rate, 2), audio_rate)
    return buffer.getvalue()


def image_file(fmt: str = "PNG", size: tuple[int, int] = (100, 60), mode: str = "RGB") -> bytes:
    width, height = size
    gradient = np.linspace(0, 255, width * height, dtype=np.float64).reshape(height, width).astype(np.uint8)
    if mode == "RGBA":
        pixels = np.stack([gradient, gradient, gradient, np.zeros_like(gradient)], axis=-1)
    else:
        pixels = np.stack([gradient, 255 - gradient, gradient // 2], axis=-1)
    buffer = io.BytesIO()
    Image.fromarray(pixels, mode).save(buffer, format=fmt)
    return buffer.getvalue()
