"""Audio samples known to be finite, so a conversation's re-sent spoken turns are checked once.

Every turn of a realtime conversation carries every earlier spoken turn, and checking each one's
samples for NaN or infinity again (`np.isfinite` over ~60,000 samples an item) grows with the
history. Samples that cannot change are checked once while they live: arrays that are read-only
down to their last numpy base (samples from the wire are views of immutable bytes, and a scope's
kept audio is the same array every turn, omnistream/service/scope_audio.py). A writable array is
checked every time. The same rule as the feature cache's digests (audio_features.py).
"""

from __future__ import annotations

import threading
import weakref

import numpy as np


class FiniteSamples:
    """Read-only arrays found finite, by identity while they live (locked: tokenizer threads)."""

    def __init__(self) -> None:
        self._known: dict[int, weakref.ref[np.ndarray]] = {}
        self._lock = threading.Lock()

    def finite(self, samples: np.ndarray) -> bool:
        """Are all `samples` finite? Remembered for arrays that cannot change."""
        ident = id(samples)
        with self._lock:
            known = self._known.get(ident)
        if known is not None and known() is samples:
            return True
        if not np.isfinite(samples).all():
            return False
        if _frozen(samples):

            def gone(ref: weakref.ref[np.ndarray]) -> None:
                with self._lock:
                    if self._known.get(ident) is ref:
                        del self._known[ident]

            with self._lock:
                self._known[ident] = weakref.ref(samples, gone)
        return True

    def __len__(self) -> int:
        return len(self._known)


def _frozen(array: np.ndarray) -> bool:
    """Read-only, and so is every numpy array it is a view of."""
    base: object = array
    while isinstance(base, np.ndarray):
        if base.flags.writeable:
            return False
        base = base.base
    return True
