"""Whisper's log-mel in two halves (thinker/log_mel.py): frames computed in pieces (of at least
`MIN_COLUMNS`, a prefix's and the rest from its samples) and finished together are the extractor's
features bit for bit, on the tiny checkpoints' 16 mels and the real model's 128, over lengths, splits,
loudnesses and seeds; a computation that is not the extractor's fails the check that guards them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from omnistream.models.qwen3_omni.thinker import log_mel
from omnistream.models.qwen3_omni.thinker.turn_frames import MIN_COLUMNS


def _extractors(extractor, clip: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(extractor._torch_extract_fbank_features(clip.copy()[None, :], "cpu"))[0]


@pytest.mark.parametrize("mels", [16, 128])
def test_frames_in_pieces_finished_together_are_the_extractors_features(mels):
    extractor = WhisperFeatureExtractor(feature_size=mels)
    n_fft, hop = extractor.n_fft, extractor.hop_length
    rng = np.random.default_rng(mels)
    for trial in range(25):
        n = int(rng.integers(MIN_COLUMNS + 3, 1100)) * hop + (int(rng.integers(hop)) if trial % 3 == 0 else 0)
        clip = (rng.standard_normal(n) * rng.uniform(1e-4, 1.0)).astype(np.float32)
        if trial % 2:
            clip[-n_fft:] = 0  # settled, as a realtime turn
        want = _extractors(extractor, clip)
        total = log_mel.frame_count(n, hop)
        assert want.shape[-1] == total
        assert torch.equal(log_mel.finish(log_mel.frames(extractor, clip, 0, total)), want)
        # The frames final in a prefix (the turn so far), then the rest in one or two pieces.
        prefix = int(rng.integers(n_fft, n))
        kept = min(log_mel.settled_frames(prefix, n_fft, hop), total - MIN_COLUMNS)
        if kept < MIN_COLUMNS:
            continue
        cut = int(rng.integers(kept, total + 1))
        if min(cut - kept, total - cut) < MIN_COLUMNS:
            cut = total  # the rest in one piece
        pieces = [
            log_mel.frames(extractor, clip[:prefix], 0, kept),
            log_mel.frames(extractor, clip, kept, cut - kept),
        ]
        if cut < total:
            pieces.append(log_mel.frames(extractor, clip, cut, total - cut))
        assert torch.equal(log_mel.finish(torch.cat(pieces, dim=1)), want)


def test_the_frames_final_in_a_prefix_are_those_whose_window_lies_inside_it():
    n_fft, hop = 400, 160
    assert log_mel.settled_frames(n_fft - 1, n_fft, hop) == 0
    assert log_mel.settled_frames(n_fft, n_fft, hop) == 2  # frames 0 and 1 end by sample 360
    assert log_mel.settled_frames(10 * hop + n_fft // 2, n_fft, hop) == 11  # frame 10 ends at its end


def test_the_check_passes_here_and_fails_a_computation_that_is_not_the_extractors():
    extractor = WhisperFeatureExtractor(feature_size=16)
    assert log_mel.supports(extractor) and log_mel.consistent(extractor, MIN_COLUMNS)

    class Normalizing(WhisperFeatureExtractor):  # as if transformers changed its features
        def _torch_extract_fbank_features(self, waveform, device="cpu"):
            features = super()._torch_extract_fbank_features(waveform, device)
            return features - features.mean()

    assert not log_mel.consistent(Normalizing(feature_size=16), MIN_COLUMNS)
    assert not log_mel.supports(WhisperFeatureExtractor(feature_size=16, dither=1e-5))
