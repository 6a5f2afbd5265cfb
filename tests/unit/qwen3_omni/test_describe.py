"""The Qwen3-Omni facts a stage reports, from a checkpoint config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omnistream.qwen3_omni.describe import describe


def test_the_tiny_checkpoint_is_described_like_the_real_model(tiny_model_dir):
    facts = describe(json.loads((Path(tiny_model_dir) / "config.json").read_text()))
    assert facts.family == "qwen3_omni"
    assert facts.voices == ("aiden", "chelsie", "ethan")
    assert (facts.talker_codebooks, facts.decoder_codebooks) == (16, 16)
    assert (facts.sample_rate, facts.samples_per_frame, facts.frames_per_second) == (24000, 1920, 12.5)


def test_voices_are_lowercased_and_frames_follow_the_upsampling():
    config = {
        "talker_config": {"speaker_id": {"Vivian": 1, "Ethan": 2}, "num_code_groups": 8},
        "code2wav_config": {"num_quantizers": 8, "upsample_rates": [8, 5, 4, 3], "upsampling_ratios": [2]},
    }
    facts = describe(config)
    assert facts.voices == ("ethan", "vivian")
    assert facts.samples_per_frame == 960 and facts.frames_per_second == 25.0


def test_a_config_without_a_decoder_is_refused():
    with pytest.raises(ValueError, match="upsampling"):
        describe({"talker_config": {}})
