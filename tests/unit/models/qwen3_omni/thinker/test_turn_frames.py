"""A turn's log-mel frames kept while it is spoken (thinker/turn_frames.py): its commit's features,
from the frames kept and its later ones, are the extractor's bit for bit over many turns; a turn
that is not the kept one's continuation (another turn with the same first second) computes its own;
the budget drops the least recently used; where the pieces fail the check nothing is kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from omnistream.models.qwen3_omni.thinker import turn_frames
from omnistream.models.qwen3_omni.thinker.turn_frames import TurnFrames

RATE = 16000


def _settled(samples: np.ndarray) -> np.ndarray:
    """As the realtime gateway commits a turn: a window of zeros after it, to a frame boundary."""
    out = np.zeros(-(-(samples.size + 400) // 160) * 160, dtype=np.float32)
    out[: samples.size] = samples
    out.flags.writeable = False
    return out


def _spoken(frames: TurnFrames, turn: np.ndarray, every: float = 2.0, jitter: int = 0) -> None:
    """The work ahead: the turn's audio so far, every `every` s of it (a little less: the resampler's
    reach is not sent)."""
    step = int(every * RATE)
    for end in range(step, turn.size + 1, step):
        frames.keep(turn[: end - jitter])


def _extractors(extractor, item: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(extractor._torch_extract_fbank_features(item.copy()[None, :], "cpu"))[0]


@pytest.mark.parametrize("mels", [16, 128])
def test_a_committed_turns_features_from_its_kept_frames_are_the_extractors(mels):
    extractor = WhisperFeatureExtractor(feature_size=mels)
    frames = TurnFrames(extractor)
    rng = np.random.default_rng(61 + mels)
    for turn_index in range(12):
        turn = (rng.standard_normal(int(rng.uniform(2.1, 12.0) * RATE)) * rng.uniform(1e-3, 1)).astype(
            np.float32
        )
        _spoken(frames, turn, every=float(rng.choice([1.0, 2.0])), jitter=int(rng.integers(0, 300)))
        item = _settled(turn)
        reused = frames.reused
        features = frames.features(item)
        assert features is not None and frames.reused == reused + 1, turn_index
        assert torch.equal(features, _extractors(extractor, item)), turn_index


def test_a_turn_that_does_not_continue_the_kept_audio_computes_its_own():
    extractor = WhisperFeatureExtractor(feature_size=16)
    frames = TurnFrames(extractor)
    rng = np.random.default_rng(5)
    turn = (0.1 * rng.standard_normal(5 * RATE)).astype(np.float32)
    _spoken(frames, turn)
    other = turn.copy()
    other[3 * RATE] += 0.25  # the same first second, then another sample where the kept audio is
    assert frames.features(_settled(other)) is None
    assert frames.features(_settled(turn[: RATE + 300])) is None  # shorter than what was kept
    assert frames.features(_settled((0.1 * rng.standard_normal(5 * RATE)).astype(np.float32))) is None
    assert frames.reused == 0 and frames.features(_settled(turn)) is not None


def test_the_budget_keeps_the_most_recently_used_turns():
    extractor = WhisperFeatureExtractor(feature_size=16)
    rng = np.random.default_rng(7)
    turns = [(0.1 * rng.standard_normal(3 * RATE)).astype(np.float32) for _ in range(3)]
    one = 3 * RATE * 4 + 16 * 4 * 300  # a 3 s turn's samples and frames, about
    frames = TurnFrames(extractor, budget_bytes=int(2.5 * one))
    for turn in turns:
        frames.keep(turn)
    assert frames.kept == 3
    assert frames.features(_settled(turns[0])) is None  # dropped for the third
    assert all(frames.features(_settled(t)) is not None for t in turns[1:])


def test_nothing_is_kept_where_the_pieces_are_not_the_extractors(monkeypatch):
    monkeypatch.setattr(turn_frames.log_mel, "consistent", lambda extractor, min_columns: False)
    frames = TurnFrames(WhisperFeatureExtractor(feature_size=16))
    turn = (0.1 * np.random.default_rng(3).standard_normal(4 * RATE)).astype(np.float32)
    _spoken(frames, turn)
    assert frames.kept == 0 and frames.features(_settled(turn)) is None
    assert TurnFrames(WhisperFeatureExtractor(feature_size=16), budget_bytes=0).usable() is False
