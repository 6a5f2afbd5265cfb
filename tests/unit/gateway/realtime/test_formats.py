"""G.711 on the realtime wire (gateway/realtime/formats.py, gateway/realtime/audio.py): appends in
mu-law / A-law at 8 kHz become the session's pcm16 24 kHz stream, a response's audio becomes whole
G.711 bytes at 8 kHz, both continuous across chunks (one resampler each), and durations exact."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.realtime.audio import OutputAudio, decode_base64_pcm
from gateway.realtime.events import EventError
from gateway.realtime.formats import FORMATS, PCM16, PCMA, PCMU, AudioFormat, InputDecoder, audioop

SECOND = np.arange(24000) / 24000
TONE = (0.5 * np.sin(2 * np.pi * 440 * SECOND)).astype(np.float32)  # 1 s of 440 Hz at 24 kHz


def _g711(fmt: AudioFormat, samples_8k: np.ndarray) -> bytes:
    pcm = (samples_8k * 32767).astype("<i2").tobytes()
    return audioop.lin2ulaw(pcm, 2) if fmt is PCMU else audioop.lin2alaw(pcm, 2)


def _linear(fmt: AudioFormat, data: bytes) -> np.ndarray:
    pcm = audioop.ulaw2lin(data, 2) if fmt is PCMU else audioop.alaw2lin(data, 2)
    return np.frombuffer(pcm, "<i2") / 32767


def test_the_formats_are_named_as_openais_schemas_name_them():
    assert FORMATS["audio/pcmu"] is FORMATS["g711_ulaw"] is PCMU
    assert FORMATS["audio/pcma"] is FORMATS["g711_alaw"] is PCMA
    assert PCMU.wire() == {"type": "audio/pcmu"} and PCM16.wire() == {"type": "audio/pcm", "rate": 24000}
    # One G.711 byte is 3 samples of the 24 kHz stream; 8000 bytes are 1 s (what audio_*_ms count).
    assert PCMU.samples(8000) == 24000 and PCM16.samples(48000) == 24000
    assert PCMA.bytes_for(48000) == 8000


@pytest.mark.parametrize("fmt", [PCMU, PCMA])
def test_g711_appends_become_one_continuous_24_khz_stream(fmt):
    data = _g711(fmt, TONE[::3])
    decoder = InputDecoder(fmt)
    pcm = b"".join(decoder.decode(data[i : i + 160]) for i in range(0, len(data), 160))  # 20 ms appends
    out = np.frombuffer(pcm, "<i2") / 32767
    assert abs(out.size - 24000) <= 64  # the resampler holds a few samples for the next append
    # The same tone, in phase (no delay, no seam at the 50 joins): G.711's error is about 1%.
    assert np.corrcoef(out[100:23000], TONE[100:23000])[0, 1] > 0.999


@pytest.mark.parametrize("fmt", [PCMU, PCMA])
def test_a_responses_audio_is_whole_g711_bytes_at_8_khz_continuous_across_deltas(fmt):
    out = OutputAudio(fmt)
    deltas = [out.convert(TONE[i : i + 1000], 24000) for i in range(0, 24000, 1000)]
    deltas.append(out.flush())
    data = b"".join(deltas)
    assert len(data) == 8000  # exactly 1 s at 8 kHz, one byte a sample: every delta is whole samples
    assert fmt.samples(len(data)) == 24000
    heard = _linear(fmt, data)
    assert np.corrcoef(heard[50:7900], TONE[::3][50:7900])[0, 1] > 0.999


def test_pcm16_output_is_unchanged_and_has_nothing_to_flush():
    out = OutputAudio()
    assert len(out.convert(TONE, 24000)) == 48000 and out.flush() == b""


def test_a_g711_append_is_limited_in_its_own_bytes():
    assert decode_base64_pcm("AAAA", "audio", 10, None, PCMU) == b"\x00" * 3  # odd lengths are fine
    with pytest.raises(EventError) as exc:
        decode_base64_pcm("AAAA", "audio", 10, None, PCM16)  # pcm16 is two bytes a sample
    assert exc.value.code == "invalid_value"
    with pytest.raises(EventError) as exc:
        decode_base64_pcm("AAAA" * 10, "audio", 8, None, PCMU)
    assert exc.value.code == "audio_too_large" and "g711_ulaw at 8000 Hz" in exc.value.message
