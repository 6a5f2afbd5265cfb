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


def test_a_settled_item_has_the_same_features_alone_and_before_longer_audio(tiny_model_dir):
    """The model's feature extractor pads a prompt's audio to the longest: an item's features (and
    frame count) change once a longer one follows it, unless it was settled."""
    from transformers import WhisperFeatureExtractor

    from gateway.realtime.audio import FEATURE_HOP, settled
    from omnistream.request.media import AudioInput

    extractor = WhisperFeatureExtractor.from_pretrained(tiny_model_dir)

    def features(batch: list[np.ndarray], row: int) -> np.ndarray:
        out = extractor(
            batch, padding=True, truncation=False, return_attention_mask=True, sampling_rate=16000
        )
        return np.asarray(out["input_features"][row])[:, : int(np.sum(out["attention_mask"][row]))]

    rng = np.random.default_rng(3)
    changed = 0
    for _ in range(12):
        raw = (rng.standard_normal(int(rng.integers(8000, 60000))) * rng.uniform(0.01, 0.5)).astype(
            np.float32
        )
        item = settled(AudioInput(raw)).samples
        assert item.size % FEATURE_HOP == 0 and not item[raw.size :].any() and item.size - raw.size >= 400
        np.testing.assert_array_equal(item[: raw.size], raw)
        for pad in (1, 160, 399, 5000):
            longer = (rng.standard_normal(item.size + pad) * 0.1).astype(np.float32)
            np.testing.assert_array_equal(features([item], 0), features([longer, item], 1))
            before, after = features([raw], 0), features([longer[: raw.size + pad], raw], 1)
            changed += before.shape != after.shape or not np.array_equal(before, after)
    assert changed  # unsettled, the same audio does get other features
