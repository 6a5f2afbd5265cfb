"""`ignore_eos` at the talker: a request that asks for exactly `max_audio_frames` never ends early.

The thinker honours `ignore_eos` by not stopping at its end token; the talker must do the same with
the end-of-speech code, or a talker that does end its speech (every real checkpoint, and the tiny
one since it ends its answers) would cut a fixed-length request short. The flag lives per cache
slot on the device, so masking is one fixed-shape op on the batch's logits, with no host sync and
nothing per row (the static frame captures it in its CUDA graph).
"""

from __future__ import annotations

import torch


class EosMask:
    """Per-slot "this request ignores EOS" flags, applied to codebook-0 logits before sampling."""

    def __init__(self, vocab: int, eos: int, slots: int, device: str | torch.device) -> None:
        self.blocked = torch.zeros(slots, dtype=torch.bool, device=device)
        self.column = torch.zeros(vocab, dtype=torch.bool, device=device)
        self.column[eos] = True

    def set(self, slot: int, ignore_eos: bool) -> None:
        """A request took `slot`: remember whether it ignores EOS (once per request)."""
        self.blocked[slot] = ignore_eos

    def apply(self, logits: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """[B, V] logits with EOS at -inf in the rows whose slot (long [B], on the device) ignores it."""
        rows = self.blocked.index_select(0, slots).unsqueeze(1)
        return logits.masked_fill(rows & self.column, float("-inf"))
