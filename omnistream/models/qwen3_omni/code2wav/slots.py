"""Code2Wav's per-stream decoder state, kept on the device in slots: what a fixed-shape step needs.

A CUDA graph reads and writes fixed addresses, and a step whose host side stacked or split each
row's state tensors would pay one op per piece (per layer, per conv) per step. So every stream's
state is one flat row of one buffer, [slots + 1, state size] (the pieces' layout: `StateShapes.flat`,
rows.py): a step gathers its rows' states with one `index_select`, writes their new states into a
staging buffer, and commits them with one `index_copy_`, whatever the batch and the model's depth.
The last slot is scratch: a bucket's padding rows read and write only there.

A stream's host side is a `SlotStream` (its slot, its position, its left trims), immutable like
`Code2WavStreamState`: a step that fails leaves it, and the slot (written only by the commit, after
the whole step succeeded), as they were, so the request can be retried alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistream.models.qwen3_omni.code2wav.rows import StateShapes


@dataclass(frozen=True)
class SlotStream:
    """One request's stream between windows, on the host: its state lives in slot `slot`."""

    slot: int
    frames: int  # frames decoded so far: the stream position of the next window's first frame
    trim: tuple[int, ...]  # per transposed conv: left-trim samples not dropped yet


class StateSlots:
    """The state buffer and its free slots (engine thread only: no lock)."""

    def __init__(self, shapes: StateShapes, slots: int, dtype: torch.dtype, device: torch.device) -> None:
        if slots < 1:
            raise ValueError(f"Code2Wav needs at least one state slot, got {slots}")
        self.shapes = shapes
        # Zeros: a slot is never read before its stream's first window, which masks it to zeros
        # anyway (a fresh stream's state is all zeros), so a reused slot needs no clearing.
        self.pool = torch.zeros((slots + 1, shapes.size), dtype=dtype, device=device)
        self.scratch = slots
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first

    @property
    def capacity(self) -> int:
        """Streams the buffer holds at once (the scratch slot not counted)."""
        return self.scratch

    def allocate(self) -> int:
        if not self._free:
            raise RuntimeError(f"Code2Wav has no free state slot (all {self.capacity} hold a stream)")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.scratch or slot in self._free:
            raise ValueError(f"state slot {slot} is not held")
        self._free.append(slot)
