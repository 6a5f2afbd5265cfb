"""Audio features kept between a conversation's turns: each turn re-sends every earlier spoken turn,
and the processor would compute all their log-mel features again (tens of ms at twenty turns).

The model's feature extractor (Whisper's log-mel: a 400-sample window every 160 samples at 16 kHz)
takes a prompt's audio as one batch padded to the longest, so an item's features in general depend
on the others: its last frames see the batch's zeros, or its own end. Not so for a settled item, one
whose length is a multiple of the hop and whose last window is zeros (what the realtime gateway
makes of every spoken turn, gateway/realtime/audio.py): its features are the same alone as in any
batch. So a batch of settled items takes each one's features from the cache (computed alone once,
keyed by the samples' digest), and any other batch goes to the extractor whole, as before: the
features are always the extractor's (tests/unit/models/qwen3_omni/thinker/test_audio_features.py).
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from transformers.feature_extraction_utils import BatchFeature

from omnistream.models.qwen3_omni.thinker import log_mel
from omnistream.models.qwen3_omni.thinker.turn_frames import DEFAULT_BUDGET_BYTES as TURN_FRAMES_BYTES
from omnistream.models.qwen3_omni.thinker.turn_frames import TurnFrames

DEFAULT_BUDGET_BYTES = 256 << 20
# The call the processor makes (`Qwen3OmniMoeProcessor._process_audio`); any other goes through.
PROCESSOR_CALL = {"padding": True, "truncation": False, "return_attention_mask": True, "return_tensors": "pt"}


class CachedAudioFeatures:
    """The processor's feature extractor, with the features of settled items kept (LRU by bytes).
    Called from the servicer's tokenizer threads: the cache is locked."""

    def __init__(self, extractor: Any, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.extractor = extractor
        self.budget_bytes = budget_bytes
        self.hop = int(extractor.hop_length)
        self.window = int(extractor.n_fft)
        self._kept: OrderedDict[bytes, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        # id(array) -> (its weak reference, rate, digest): see `_key`.
        self._keys: dict[int, tuple[weakref.ref[np.ndarray], Any, bytes]] = {}
        self.hits = 0
        self.misses = 0
        # The frames of turns still spoken, kept for their commits (turn_frames.py).
        self.turns = TurnFrames(extractor, budget_bytes=min(budget_bytes, TURN_FRAMES_BYTES))

    def __getattr__(self, name: str) -> Any:  # everything else is the extractor's
        return getattr(self.extractor, name)

    def settled(self, samples: np.ndarray) -> bool:
        """Does the item end on a frame boundary after a window of zeros?"""
        return (
            samples.ndim == 1
            and samples.size % self.hop == 0
            and samples.size >= self.window
            and not (samples[-self.window :].any())
        )

    def __call__(self, audio: Any, **kwargs: Any) -> Any:
        call = {k: v for k, v in kwargs.items() if k != "sampling_rate"}
        items = [np.asarray(a) for a in audio] if isinstance(audio, (list, tuple)) else None
        if self.budget_bytes <= 0 or call != PROCESSOR_CALL or not items or not all(map(self.settled, items)):
            return self.extractor(audio, **kwargs)
        rows = [self._features(item, kwargs) for item in items]
        frames = max(f.shape[-1] for f, _ in rows)
        features, mask = rows[0]
        batch = torch.zeros((len(rows), features.shape[0], frames), dtype=features.dtype)
        masks = torch.zeros((len(rows), frames), dtype=mask.dtype)
        for i, (f, m) in enumerate(rows):
            batch[i, :, : f.shape[-1]] = f
            masks[i, : m.shape[-1]] = m
        return BatchFeature({"input_features": batch, "attention_mask": masks})

    def item(self, samples: np.ndarray, sampling_rate: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One settled item's features [mels, frames] and frame mask, as the processor's call would
        hold them in any batch (cached): a prompt whose audio is all settled need not go through
        the processor at all (thinker/media_prompt.py)."""
        return self._features(samples, {**PROCESSOR_CALL, "sampling_rate": sampling_rate})

    def _alone(self, item: np.ndarray, kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """One settled item's features and frame mask: Whisper's log-mel computation itself where
        the extractor is Whisper's (no dither: the same samples give the same features), else
        the extractor's call. For one item the call pads nothing and masks nothing, but its
        batching, padding and tensor conversions took ~1.7 of its 2.7 ms on a 9 s turn, the
        realtime commit's own work, growing with the turn (issue 61). The same numbers bit for
        bit (tests/unit/models/qwen3_omni/thinker/test_audio_features.py, over lengths and seeds)."""
        if not log_mel.supports(self.extractor):
            out = self.extractor([item], **kwargs)
            n = int(out["attention_mask"][0].sum())
            return out["input_features"][0, :, :n].clone(), out["attention_mask"][0, :n].clone()
        # A settled item's length is a multiple of the hop: the call's last frame (of the
        # padding) is dropped in fbank, and its mask is every frame. A realtime turn's features
        # are computed from the frames kept while it was spoken where there are (turn_frames.py).
        features = self.turns.features(item)
        if features is None:  # the extractor's own computation, on a writable copy for torch
            wave = np.array(item, dtype=np.float32)[None, :]
            features = torch.from_numpy(self.extractor._torch_extract_fbank_features(wave, "cpu"))[0]
        return features, torch.ones(features.shape[-1], dtype=torch.int32)

    def _key(self, item: np.ndarray, rate: Any) -> bytes:
        """The item's digest. A read-only array (samples from the wire, and the thinker's kept audio
        of a scope: the same array every turn) is hashed once while it lives, not every turn."""
        memo = self._keys.get(id(item)) if not item.flags.writeable else None
        if memo is not None and memo[0]() is item and memo[1] == rate:
            return memo[2]
        key = hashlib.sha256(f"{item.dtype}\0{rate}\0".encode() + item.tobytes()).digest()
        if not item.flags.writeable:
            ident = id(item)

            def gone(_: weakref.ref[np.ndarray]) -> None:
                self._keys.pop(ident, None)

            with self._lock:
                self._keys[ident] = (weakref.ref(item, gone), rate, key)
        return key

    def _features(self, item: np.ndarray, kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """One settled item's features [mels, frames] and frame mask, alone (cached)."""
        key = self._key(item, kwargs.get("sampling_rate"))
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                self.hits += 1
                return kept
        kept = self._alone(item, kwargs)
        with self._lock:
            self.misses += 1
            if key not in self._kept:
                self._kept[key] = kept
                self._bytes += kept[0].numel() * kept[0].element_size()
                while self._bytes > self.budget_bytes and self._kept:
                    _, (features, _) = self._kept.popitem(last=False)
                    self._bytes -= features.numel() * features.element_size()
        return kept
