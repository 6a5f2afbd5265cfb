"""Realtime audio conversions: pcm16 in, checked; the stages' float audio out as pcm16 24 kHz."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from gateway.media.file_decode import Deadline, decode_audio
from gateway.media.limits import MediaLimits, Tally
from gateway.realtime.audio import OutputAudio, decode_base64_pcm, encoded_turn
from gateway.realtime.events import EventError


def test_base64_pcm_is_checked_before_and_after_decoding():
    assert decode_base64_pcm(base64.b64encode(b"\x01\x02").decode(), "audio", 10, None) == b"\x01\x02"
    for data, code in (("A" * 100, "audio_too_large"), ("***", "invalid_value"), ("AQ==", "invalid_value")):
        with pytest.raises(EventError) as caught:
            decode_base64_pcm(data, "audio", 10, "e")
        assert caught.value.code == code and caught.value.event_id == "e"


def test_a_turn_decodes_to_the_thinkers_16_khz_through_the_media_decoder():
    t = np.arange(24000) / 24000
    pcm = (0.5 * np.sin(2 * np.pi * 440 * t) * 32767).astype("<i2").tobytes()
    media = encoded_turn(pcm, "input_audio_buffer")
    audio = decode_audio(media.data, media.mime, media.field, Tally(MediaLimits()), Deadline(10))
    assert audio.sample_rate == 16000 and abs(audio.samples.size - 16000) <= 32
    assert 0.3 < np.abs(audio.samples).max() <= 0.51


def test_output_audio_is_pcm16_at_24_khz_whatever_the_stage_rate():
    out = OutputAudio()
    assert len(out.convert(np.zeros(2400, np.float32), 24000)) == 4800
    resampled = OutputAudio()
    total = sum(len(resampled.convert(np.zeros(1600, np.float32), 16000)) for _ in range(10)) // 2
    assert abs(total - 24000) <= 100  # 1 s at 16 kHz is about 1 s at 24 kHz (the resampler keeps a tail)
