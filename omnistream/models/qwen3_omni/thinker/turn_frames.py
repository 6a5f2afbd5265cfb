"""The log-mel frames of realtime turns still being spoken, kept so that a commit computes only the
frames its turn gained since (log_mel.py says why that is exact).

The work ahead (gateway/realtime/work_ahead.py) sends a turn's audio so far every 2 s: each time,
the frames already final in it are extended by the new ones and kept, under the digest of the
turn's first second. The committed turn (its samples, settled: gateway/realtime/audio.py) finds
them by the same digest, checks that the kept samples are where its own begin, sample for sample,
and has only the frames after them computed: on the real model's 128 mels, 2.6 ms of a 9 s turn's
features and 12 ms of a 30 s one's were computed at the commit. Bounded by bytes, least recently
used first. Locked: called from the servicer's tokenizer threads.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from omnistream.models.qwen3_omni.thinker import log_mel

log = logging.getLogger(__name__)

HEAD_SECONDS = 1  # of a turn, digested to find its frames
# Frames computed in one piece at least: fewer take another matmul path (other rounding) on x86 MKL.
MIN_COLUMNS = 32
DEFAULT_BUDGET_BYTES = 64 << 20


@dataclass(frozen=True)
class _Kept:
    samples: np.ndarray  # the turn's audio so far
    frames: torch.Tensor  # [mels, n] before the clamp: the frames final in it


class TurnFrames:
    def __init__(self, extractor: Any, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.extractor = extractor
        self.budget_bytes = budget_bytes
        self.n_fft, self.hop = int(extractor.n_fft), int(extractor.hop_length)
        self._usable: bool | None = None if budget_bytes > 0 and log_mel.supports(extractor) else False
        self._kept: OrderedDict[bytes, _Kept] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.kept = 0  # turns' audio so far whose frames were kept
        self.reused = 0  # committed turns whose frames began with kept ones

    def usable(self) -> bool:
        """Frames in pieces are the extractor's own here (`log_mel.consistent`, checked once)."""
        if self._usable is None:
            with self._lock:
                if self._usable is None:
                    self._usable = log_mel.consistent(self.extractor, MIN_COLUMNS)
                    if not self._usable:
                        log.warning("log-mel frames in pieces differ from the extractor's here: not kept")
        return self._usable

    def keep(self, samples: np.ndarray) -> None:
        """A turn's audio so far (more will follow): the frames final in it kept, only those new
        since its last call computed."""
        if not self._fits(samples):
            return
        settled = log_mel.settled_frames(samples.size, self.n_fft, self.hop)
        key = self._key(samples)
        with self._lock:
            old = self._kept.get(key)
        have = old.frames if old is not None and _begins(samples, old.samples) else None
        start = 0 if have is None else int(have.shape[1])
        if settled - start < MIN_COLUMNS:
            return  # kept as it is until more audio came
        new = log_mel.frames(self.extractor, samples, start, settled - start)
        frames = new if have is None else torch.cat([have, new], dim=1)
        self._store(key, _Kept(samples, frames))

    def features(self, item: np.ndarray) -> torch.Tensor | None:
        """A settled turn's features [mels, frames], from the kept frames its samples begin with
        and its later ones; None when none are kept for it."""
        if not self._fits(item):
            return None
        key = self._key(item)
        with self._lock:
            old = self._kept.get(key)
            if old is not None:
                self._kept.move_to_end(key)
        if old is None or not _begins(item, old.samples):
            return None
        total = log_mel.frame_count(item.size, self.hop)
        start = min(int(old.frames.shape[1]), total - MIN_COLUMNS)
        if start < 2:  # what is left reaches the clip's start: computed whole
            return None
        tail = log_mel.frames(self.extractor, item, start, total - start)
        with self._lock:
            self.reused += 1
        return log_mel.finish(torch.cat([old.frames[:, :start], tail], dim=1))

    def _fits(self, samples: np.ndarray) -> bool:
        """Long enough to have a first second to be found by, past one window, and kept here."""
        return samples.ndim == 1 and samples.size >= self._head() + self.n_fft and self.usable()

    def _head(self) -> int:
        return HEAD_SECONDS * int(self.extractor.sampling_rate)

    def _key(self, samples: np.ndarray) -> bytes:
        head = np.ascontiguousarray(samples[: self._head()], dtype=np.float32)
        return hashlib.sha256(head.tobytes()).digest()

    def _store(self, key: bytes, kept: _Kept) -> None:
        size = _size(kept)
        if size > self.budget_bytes:
            return
        with self._lock:
            self.kept += 1
            old = self._kept.pop(key, None)
            if old is not None:
                self._bytes -= _size(old)
            self._kept[key] = kept
            self._bytes += size
            while self._bytes > self.budget_bytes:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= _size(dropped)


def _begins(samples: np.ndarray, prefix: np.ndarray) -> bool:
    return prefix.size <= samples.size and np.array_equal(samples[: prefix.size], prefix)


def _size(kept: _Kept) -> int:
    return int(kept.samples.nbytes) + kept.frames.numel() * kept.frames.element_size()
