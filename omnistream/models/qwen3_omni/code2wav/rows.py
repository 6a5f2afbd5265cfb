"""A streaming Code2Wav step's rows: where the forward reads their old state and leaves their new.

The forward (forward.py) reads per piece of state (per layer its cached keys and values, per causal
conv its input tail, per transposed conv its pending overlap) one [B, ...] tensor of every row's
old piece, and appends one [B, ...] tensor of every row's new piece, in the order it meets them.
Two sources, the same values:

- `StackedRows`: immutable per-request states (`Code2WavStreamState`), stacked per piece and split
  back with `unbind` (`StreamingCode2Wav`, the reference path: tests hold it to the module's own
  forward);
- `SlotRows`: every request's state as one flat row of a per-slot buffer (slots.py), gathered with
  one `index_select` and written back with one `cat` into a staging buffer (`StaticCode2WavStep`,
  the engine's fixed-shape step: no op per piece or per row outside its capturable region).

The step's plan is one device tensor [B, 2 + 2 * stages (+ 1)]: each row's stream position, its
valid length before the first and after each transposed conv, the left trim each drops now (and,
for slot rows, its slot). `stage_lengths` works those lengths out on the host, from host ints only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateShapes:
    """One row's state pieces (shapes without the batch), in the order the forward meets them."""

    keys: tuple[tuple[int, ...], ...]  # per layer [kv_heads, window - 1, head_dim], after RoPE
    values: tuple[tuple[int, ...], ...]
    tails: tuple[tuple[int, ...], ...]  # per causal conv, forward order: [in_channels, receptive - 1]
    pending: tuple[tuple[int, ...], ...]  # per transposed conv: [out_channels, kernel - stride]

    def flat(self) -> list[tuple[int, ...]]:
        """Every piece's shape in the flat layout's order: keys, values, tails, pending."""
        return [*self.keys, *self.values, *self.tails, *self.pending]

    @property
    def size(self) -> int:
        """Elements of one row's whole state."""
        return sum(math.prod(shape) for shape in self.flat())


def stage_lengths(
    strides: Sequence[int], trims: Sequence[Sequence[int]], lens: Sequence[int]
) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """On the host, per transposed conv: each row's valid length before the first and after each
    one, the left trim each drops now, and the trim each row has left after it (`trims`: each row's
    left-trim samples not dropped yet, per transposed conv)."""
    stage_lens = [list(lens)]
    drops: list[list[int]] = []
    left: list[list[int]] = []
    for index, stride in enumerate(strides):
        produced = [n * stride for n in stage_lens[-1]]
        drop = [min(t[index], n) for t, n in zip(trims, produced, strict=True)]
        drops.append(drop)
        left.append([t[index] - d for t, d in zip(trims, drop, strict=True)])
        stage_lens.append([n - d for n, d in zip(produced, drop, strict=True)])
    return stage_lens, drops, left


class StepRows:
    """What the forward reads of a step's rows besides its codes, and the new pieces it leaves."""

    def __init__(self, plan: torch.Tensor, out_lengths: Sequence[int], shifts: Sequence[bool]) -> None:
        self.plan = plan  # device [B, 2 + 2 * stages (+ slot)]: see the module doc
        self.stages = len(out_lengths)
        self.out_lengths = list(out_lengths)  # per transposed conv: the [B, C, L] output's L (host)
        self.shifts = list(shifts)  # per transposed conv: does any row drop a left trim now?
        self.conv = 0  # the forward's place: causal convs and transposed convs met so far
        self.trans = 0
        self.keys: list[torch.Tensor] = []  # per layer [B, kv_heads, window - 1, head_dim]
        self.values: list[torch.Tensor] = []
        self.tails: list[torch.Tensor] = []
        self.pending: list[torch.Tensor] = []
        self._tail_index: dict[tuple[int, int, int], torch.Tensor] = {}

    def frames(self) -> torch.Tensor:
        """Device [B] stream position of each row (frames decoded before this step)."""
        return self.plan[:, 0]

    def lens(self, stage: int) -> torch.Tensor:
        """Device [B] valid length of each row after `stage` transposed convs (0: frames in)."""
        return self.plan[:, 1 + stage]

    def drops(self, stage: int) -> torch.Tensor:
        """Device [B] left-trim samples transposed conv `stage` drops from each row."""
        return self.plan[:, 2 + self.stages + stage]

    def tail_index(self, stage: int, width: int, channels: int, offsets: torch.Tensor) -> torch.Tensor:
        """[B, channels, width] gather index of each row's last `width` inputs at `stage`
        (n_b + 0..width-1), made once per step for all the convs that share it."""
        key = (stage, width, channels)
        index = self._tail_index.get(key)
        if index is None:
            at = (self.lens(stage)[:, None] + offsets)[:, None, :]
            index = self._tail_index[key] = at.expand(-1, channels, -1)
        return index

    def old_piece(self, kind: int, index: int) -> torch.Tensor:
        """Every row's old piece `index` of `kind` (0 keys, 1 values, 2 tails, 3 pending), batched."""
        raise NotImplementedError

    def old_keys(self, layer: int) -> torch.Tensor:
        return self.old_piece(0, layer)

    def old_values(self, layer: int) -> torch.Tensor:
        return self.old_piece(1, layer)

    def old_tails(self, conv: int) -> torch.Tensor:
        return self.old_piece(2, conv)

    def old_pending(self, trans: int) -> torch.Tensor:
        return self.old_piece(3, trans)

    def new_pieces(self) -> list[torch.Tensor]:
        """The new pieces in the flat layout's order (StateShapes.flat)."""
        return [*self.keys, *self.values, *self.tails, *self.pending]


class StackedRows(StepRows):
    """Old pieces stacked from each row's own state tensors (one `stack` per piece)."""

    def __init__(
        self,
        states: Sequence[Sequence[Sequence[torch.Tensor]]],
        plan: torch.Tensor,
        out_lengths: Sequence[int],
        shifts: Sequence[bool],
    ) -> None:
        super().__init__(plan, out_lengths, shifts)
        self.states = states  # per row: (keys, values, tails, pending), each a sequence of pieces

    def old_piece(self, kind: int, index: int) -> torch.Tensor:
        return torch.stack([s[kind][index] for s in self.states])


class SlotRows(StepRows):
    """Old pieces as views of one [B, state size] tensor of every row's flat state (see slots.py)."""

    def __init__(
        self,
        shapes: StateShapes,
        old: torch.Tensor,
        plan: torch.Tensor,
        out_lengths: Sequence[int],
        shifts: Sequence[bool],
    ) -> None:
        super().__init__(plan, out_lengths, shifts)
        self.old = old  # [B, size]: each row's state, zeros for a row at its stream's start
        flat = shapes.flat()
        self._views: list[tuple[int, tuple[int, ...]]] = []
        offset = 0
        for shape in flat:
            self._views.append((offset, shape))
            offset += math.prod(shape)
        counts = (len(shapes.keys), len(shapes.values), len(shapes.tails))
        self._starts = (0, counts[0], counts[0] + counts[1], counts[0] + counts[1] + counts[2])

    def old_piece(self, kind: int, index: int) -> torch.Tensor:
        offset, shape = self._views[self._starts[kind] + index]
        return self.old[:, offset : offset + math.prod(shape)].view(self.old.shape[0], *shape)

    def new_state(self, out: torch.Tensor) -> torch.Tensor:
        """Every row's new state, flat, written into `out` [B, size] in one `cat`."""
        batch = out.shape[0]
        return torch.cat([p.reshape(batch, -1) for p in self.new_pieces()], dim=1, out=out)
