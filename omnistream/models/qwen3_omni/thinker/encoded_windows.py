"""Audio encoder windows encoded ahead, for the request that will need them.

A realtime turn's audio arrives over seconds; its request comes at the commit. The audio encoder
attends within windows of `n_window_infer` mel frames, so the rows of a window depend on that
window's features alone (thinker_media.py encodes in such slices). While the user speaks, the
gateway sends the turn's audio so far as work ahead (`ThinkerParams.encode_only`): the thinker
encodes the windows that are complete and keeps their rows here, and the committed request's
windows are looked up before the encoder runs.

The key is the window's features themselves (bytes, dtype and shape) in the request's cache scope,
never a position or a request id: a window is taken only when the committed audio's features are
bit for bit those that were encoded, so a row that is reused is the row the encoder would give. When
they differ (a louder part later raises the item's log-mel maximum, which every frame is clamped
against), the lookup misses and the window is encoded as before. Bounded by bytes (LRU); a scope's
windows go when it ends (a realtime session closing).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from omnistream.models.qwen3_omni.thinker.thinker_media import AUDIO, Slice, encode_slices

DEFAULT_BUDGET_BYTES = 64 << 20
# The last mel frames of an item still being spoken, which the samples after it may change: a
# frame's STFT window reaches n_fft/2 (200) samples past its centre (hop 160).
UNSETTLED_FRAMES = 2
Rows = tuple[torch.Tensor, list[torch.Tensor] | None]


def window_key(scope: bytes, features: torch.Tensor) -> bytes:
    """The digest a window's features [mels, frames] are kept under in `scope`."""
    data = features.detach().contiguous().cpu()
    head = f"{scope.hex()}\0{data.dtype}\0{tuple(data.shape)}\0".encode()
    return hashlib.sha256(head + data.view(torch.uint8).numpy().tobytes()).digest()


class EncodedWindows:
    """Encoder rows by window key. Stored and read on the engine thread; a scope's release may come
    from any thread (locked)."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._rows: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._scope_of: dict[bytes, bytes] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.stored = 0

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: bytes, count: bool = True) -> torch.Tensor | None:
        """The rows kept under `key` (None: not kept), now the most recent. `count`: a request's
        lookup (hits and misses); work ahead asking what it need not encode again is not one."""
        with self._lock:
            rows = self._rows.get(key)
            if rows is not None:
                self._rows.move_to_end(key)
            if count:
                self.hits += rows is not None
                self.misses += rows is None
            return rows

    def put(self, key: bytes, scope: bytes, rows: torch.Tensor) -> None:
        size = rows.numel() * rows.element_size()
        if size > self.budget_bytes:
            return
        with self._lock:
            if key in self._rows:
                self._rows.move_to_end(key)
                return
            self._rows[key] = rows.detach().clone()
            self._scope_of[key] = scope
            self._bytes += size
            self.stored += 1
            while self._bytes > self.budget_bytes:
                self._drop(next(iter(self._rows)))

    def release(self, scope: bytes) -> None:
        """`scope` ended: its windows can never be asked for again."""
        with self._lock:
            for key in [k for k, s in self._scope_of.items() if s == scope]:
                self._drop(key)

    def _drop(self, key: bytes) -> None:
        rows = self._rows.pop(key)
        self._scope_of.pop(key, None)
        self._bytes -= rows.numel() * rows.element_size()


def ahead_slices(slices: Sequence[Slice], window: int) -> list[Slice]:
    """What work ahead encodes of the audio items of a turn still being spoken: their whole
    `window`-frame slices whose frames are final. One taken that does not match the committed
    audio's is only work wasted."""
    totals: dict[int, int] = {}
    for s in slices:
        if s.kind == AUDIO:
            totals[s.item] = totals.get(s.item, 0) + s.cost
    ahead, ends = [], dict.fromkeys(totals, 0)
    for s in slices:
        if s.kind == AUDIO:
            ends[s.item] += s.cost
            if s.cost == window and ends[s.item] <= totals[s.item] - UNSETTLED_FRAMES:
                ahead.append(s)
    return ahead


def encode_keeping(
    model: Any, windows: EncodedWindows, window: int, pieces: Sequence[tuple[bytes, bool, Slice]]
) -> list[Rows]:
    """`encode_slices` over pieces (cache scope, is work ahead, slice): a whole audio window kept
    is taken, not encoded (work ahead sent again encodes none of its windows twice), and work
    ahead's windows are kept."""
    keys: list[bytes | None] = [None] * len(pieces)
    rows: list[Rows | None] = [None] * len(pieces)
    for i, (scope, ahead, piece) in enumerate(pieces):
        if piece.kind == AUDIO and piece.cost == window and (ahead or len(windows)):
            key = keys[i] = window_key(scope, piece.data)
            kept = windows.get(key, count=not ahead)
            if kept is not None:
                rows[i] = (kept, None)
    missing = [i for i, r in enumerate(rows) if r is None]
    if missing:
        for i, result in zip(missing, encode_slices(model, [pieces[i][2] for i in missing]), strict=True):
            rows[i] = result
            kept_as = keys[i]
            if pieces[i][1] and kept_as is not None:
                windows.put(kept_as, pieces[i][0], result[0])
    return [r for r in rows if r is not None]
