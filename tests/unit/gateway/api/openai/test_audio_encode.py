"""The speech encoders: lossless formats carry the 16-bit samples exactly, every format streams its
bytes as samples come (not at the end), and the files decode with soundfile / PyAV."""

from __future__ import annotations

import io
import struct

import av
import numpy as np
import pytest
import soundfile as sf

from gateway.api.openai.audio_encode import FORMATS, MEDIA_TYPES, encode_whole, encoder
from omnistream.audio.wav import to_pcm16

RATE = 24000


@pytest.fixture(scope="module")
def samples() -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(RATE * 2) / RATE
    tone = 0.5 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 1.5 * t)
    return (tone + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def _stream(fmt: str, samples: np.ndarray, piece: int = 1920 * 4) -> list[bytes]:
    enc = encoder(fmt, RATE)
    out = [enc.write(samples[i : i + piece]) for i in range(0, samples.size, piece)]
    return [*out, enc.close()]


def _pcm(samples: np.ndarray) -> np.ndarray:
    return np.frombuffer(to_pcm16(samples), dtype="<i2")


def _decode(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray() for f in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    return np.concatenate([f.reshape(f.shape[0], -1)[0] for f in frames]), rate


def test_every_openai_format_has_a_media_type():
    assert set(FORMATS) == set(MEDIA_TYPES) == {"mp3", "opus", "aac", "flac", "wav", "pcm"}


def test_pcm_is_16_bit_little_endian(samples):
    data = b"".join(_stream("pcm", samples))
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), _pcm(samples))
    assert encode_whole("pcm", samples, RATE) == data


def test_streamed_wav_has_its_header_first_then_the_samples(samples):
    pieces = _stream("wav", samples)
    head = pieces[0][:44]
    assert head[:4] == b"RIFF" and head[8:16] == b"WAVEfmt " and head[36:40] == b"data"
    fmt, channels, rate, _, _, bits = struct.unpack("<HHIIHH", head[20:36])
    assert (fmt, channels, rate, bits) == (1, 1, RATE, 16)
    np.testing.assert_array_equal(np.frombuffer(b"".join(pieces)[44:], "<i2"), _pcm(samples))
    whole, rate = sf.read(io.BytesIO(encode_whole("wav", samples, RATE)), dtype="int16")
    assert rate == RATE
    np.testing.assert_array_equal(whole, _pcm(samples))


def test_an_empty_wav_stream_is_still_a_header():
    enc = encoder("wav", RATE)
    assert enc.close()[:4] == b"RIFF"


def test_flac_is_lossless_streamed_and_whole(samples):
    streamed = b"".join(_stream("flac", samples))
    decoded, rate = _decode(streamed)
    assert rate == RATE
    scale = 2 ** (8 * decoded.dtype.itemsize - 1) // 32768
    np.testing.assert_array_equal(decoded // scale, _pcm(samples))
    whole, rate = sf.read(io.BytesIO(encode_whole("flac", samples, RATE)), dtype="int16")
    assert rate == RATE
    np.testing.assert_array_equal(whole, _pcm(samples))


@pytest.mark.parametrize("fmt", FORMATS)
def test_bytes_leave_as_samples_come_not_at_the_end(samples, fmt):
    pieces = _stream(fmt, samples)
    written = pieces[:-1]
    # every format has produced most of its bytes before close (the encoder's lookahead aside)
    assert sum(map(len, written[len(written) // 2 :])) > 0
    assert sum(map(len, written)) > 0.5 * sum(map(len, pieces))


@pytest.mark.parametrize(("fmt", "rate"), [("mp3", RATE), ("aac", RATE), ("opus", 48000)])
def test_lossy_formats_decode_to_the_same_length_at_their_rate(samples, fmt, rate):
    decoded, got = _decode(b"".join(_stream(fmt, samples)))
    assert got == rate
    expected = samples.size * rate // RATE
    # encoder delay and padding add at most a few frames
    assert expected <= decoded.size <= expected + 4096 * rate // RATE


def test_whole_and_streamed_lossy_files_decode_alike(samples):
    a, _ = _decode(encode_whole("opus", samples, RATE))
    b, _ = _decode(b"".join(_stream("opus", samples)))
    np.testing.assert_allclose(a, b, atol=1e-6)


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown audio format"):
        encoder("ogg", RATE)
