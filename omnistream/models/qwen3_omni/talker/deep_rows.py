"""The thinker's deep hidden rows at a talker prompt's multimodal positions, as one tensor.

A conversation's prompt holds every earlier spoken turn, so at twenty turns of speech it brings the
talker ~1,300 such rows each turn. Kept as a dict of row views they cost the talker milliseconds
per turn in per-row Python (making the views, moving each to the device, checking each, stacking
them again for the prompt and again for the prefix keys), at the moment the thinker needs the CPU
for the answer's next token. Here they stay one [n, H] tensor with the positions beside it: moved
in one copy, checked once, and taken by position with one index.

It is still a mapping of position -> row (what a caller may pass, and what tests read), so any
`Mapping[int, Tensor]` is accepted where these are (`DeepRows.of`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch


class DeepRows(Mapping[int, torch.Tensor]):
    """`rows[i]` is the deep row at prompt position `positions[i]`."""

    def __init__(self, positions: Sequence[int], rows: torch.Tensor) -> None:
        if rows.dim() != 2 or rows.shape[0] != len(positions):
            n = len(positions)
            raise ValueError(f"{n} positions need [{n}, H] rows, got {tuple(rows.shape)}")
        self.positions = list(positions)
        self.rows = rows
        self._index = {p: i for i, p in enumerate(self.positions)}
        if len(self._index) != len(self.positions):
            raise ValueError("a prompt position has two deep rows")

    @classmethod
    def of(cls, given: Mapping[int, torch.Tensor]) -> DeepRows:
        """`given` as DeepRows (itself when it is one; a mapping's rows are stacked once)."""
        if isinstance(given, DeepRows):
            return given
        positions = list(given)
        rows = [given[p] for p in positions]
        if not rows:
            return cls([], torch.empty(0, 0))
        if any(r.dim() != 1 or r.shape != rows[0].shape for r in rows):
            shapes = sorted({tuple(r.shape) for r in rows})
            raise ValueError(f"deep rows must be vectors of one width, got {shapes}")
        return cls(positions, torch.stack(rows))

    @property
    def width(self) -> int:
        return int(self.rows.shape[1])

    def to(self, device: torch.device | str, dtype: torch.dtype) -> DeepRows:
        """On `device` in `dtype`, in one copy (itself when already there)."""
        moved = self.rows.to(device, dtype)
        return self if moved is self.rows else DeepRows(self.positions, moved)

    def take(self, positions: Sequence[int]) -> torch.Tensor:
        """[len(positions), H]: the rows at `positions`, in that order (KeyError for one it lacks)."""
        picks = [self._index[p] for p in positions]
        if not picks:
            return self.rows[:0]
        first = picks[0]
        if picks == list(range(first, first + len(picks))):  # the usual case: all of them, in order
            return self.rows[first : first + len(picks)]
        return self.rows.index_select(0, torch.tensor(picks, dtype=torch.long, device=self.rows.device))

    def __getitem__(self, position: int) -> torch.Tensor:
        return self.rows[self._index[position]]

    def __contains__(self, position: object) -> bool:
        return position in self._index

    def __iter__(self) -> Iterator[int]:
        return iter(self.positions)

    def __len__(self) -> int:
        return len(self.positions)
