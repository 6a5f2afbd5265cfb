"""Whisper's log-mel features in two exact halves, so that a turn's frames can be computed as it is
spoken and only its new ones at the commit.

The model's feature extractor (transformers' WhisperFeatureExtractor, `_torch_extract_fbank_features`)
computes, per frame, the power spectrum of a 400-sample window every 160 samples (the signal
reflected at both ends), its mel projection and log10; then clamps every value to 8 below the
clip's maximum and rescales. Everything before the clamp is per frame: a frame's values depend on
its own window of samples only, and they come out bit for bit the same whether the frame is
computed with the whole clip or with a part of it (tests/unit/models/qwen3_omni/thinker/
test_log_mel.py, over lengths, splits and seeds; the extractor's FFT and matmul give each frame the
same arithmetic however many are batched). The clamp needs the whole clip's maximum, so it is
`finish`ed at the end: `finish(frames(x, 0, n))` is the extractor's features of x.

So a prefix of a turn (the realtime work ahead, gateway/realtime/work_ahead.py) keeps the frames
whose windows lie inside it (`settled_frames`), and the commit computes the rest from their
samples (`frames(x, first, count)`), finishes all of them, and gets the features the extractor
would have computed from scratch, in time that does not grow with the turn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def supports(extractor: Any) -> bool:
    """Is `extractor` the computation this module reproduces (Whisper's, without dither)?"""
    return (
        callable(getattr(extractor, "_torch_extract_fbank_features", None))
        and getattr(extractor, "dither", 0.0) == 0.0
        and getattr(extractor, "mel_filters", None) is not None
    )


def frame_count(samples: int, hop: int) -> int:
    """The frames the extractor makes of `samples` samples (it drops the STFT's last frame)."""
    return samples // hop


def settled_frames(samples: int, n_fft: int, hop: int) -> int:
    """How many leading frames of a clip that goes on past `samples` are already final: those whose
    window lies wholly inside the first `samples` samples (the later ones reach its end)."""
    return max(0, (samples - n_fft // 2) // hop + 1) if samples >= n_fft else 0


def frames(extractor: Any, samples: np.ndarray, first: int, count: int) -> torch.Tensor:
    """Frames [first, first + count) of `samples`' log-mel before the clamp, [mels, count]: those
    the extractor computes for the clip `samples` (the end of a clip reflected as it reflects
    it), or, for a clip that goes on, `first + count <= settled_frames(samples.size)`."""
    n_fft, hop = int(extractor.n_fft), int(extractor.hop_length)
    window = torch.hann_window(n_fft)
    half = n_fft // 2
    if first * hop < half:  # the start's reflection: from the clip's start, as the extractor
        wave = torch.from_numpy(np.array(samples, dtype=np.float32))[None, :]
        stft = torch.stft(wave, n_fft, hop, window=window, return_complex=True)[..., first : first + count]
    else:  # windows from `first`'s on, and the end reflected where they reach past it
        start, end = first * hop - half, (first + count - 1) * hop + half
        wave = torch.from_numpy(np.array(samples[start:end], dtype=np.float32))
        if end > samples.size:
            reach = end - samples.size
            wave = torch.cat([wave, wave[-reach - 1 : -1].flip(0)])
        stft = torch.stft(wave[None, :], n_fft, hop, window=window, center=False, return_complex=True)
    magnitudes = (stft.abs() ** 2).contiguous()
    mel_filters = torch.from_numpy(extractor.mel_filters).to("cpu", torch.float32)
    return torch.clamp(mel_filters.T @ magnitudes, min=1e-10).log10()[0]


def finish(log_spec: torch.Tensor) -> torch.Tensor:
    """A whole clip's frames [mels, n] as the extractor's features: clamped to 8 below their
    maximum, rescaled."""
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def consistent(extractor: Any, min_columns: int) -> bool:
    """Do frames computed in pieces (of at least `min_columns`: fewer take another matmul path on
    this machine's BLAS, with other rounding) come out as the extractor's own, on this machine's
    kernels and this transformers' extractor? Checked on a fixed noise clip: where it fails, the
    pieces are not used and every clip's features are computed whole."""
    n_fft, hop = int(extractor.n_fft), int(extractor.hop_length)
    clip = (0.1 * np.random.default_rng(61).standard_normal(hop * 300 + 77)).astype(np.float32)
    total = frame_count(clip.size, hop)
    whole = frames(extractor, clip, 0, total)
    want = torch.from_numpy(extractor._torch_extract_fbank_features(clip.copy()[None, :], "cpu"))[0]
    if not torch.equal(finish(whole), want):
        return False
    for length, first in ((hop * 60 + 13, 0), (hop * 140, 2), (clip.size, 100)):
        settled = settled_frames(length, n_fft, hop)
        for count in (min_columns, min_columns + 3, settled - first):
            if (
                count >= min_columns
                and first + count <= settled
                and not torch.equal(
                    frames(extractor, clip[:length], first, count), whole[:, first : first + count]
                )
            ):
                return False
    tail = total - 150
    return torch.equal(frames(extractor, clip, 150, tail), whole[:, 150:])
