"""Stand-ins for captured CUDA graphs, so a step's graph path (static inputs, one graph per bucket,
the capture check) runs on the CPU: `FakeGraph` replays its step into the outputs it returned at
capture; `WrongGraph` replays something else (what the capture check must catch)."""

from __future__ import annotations

from collections.abc import Callable

import torch

Outputs = torch.Tensor | tuple[torch.Tensor, ...]


def _tensors(out: Outputs) -> tuple[torch.Tensor, ...]:
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


class FakeGraph:
    """A "captured" step: its outputs are made once, and each replay re-runs the step into them."""

    def __init__(self, step: Callable[[], Outputs]) -> None:
        self.step = step
        self.out = step()
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1
        for mine, new in zip(_tensors(self.out), _tensors(self.step()), strict=True):
            mine.copy_(new)


class WrongGraph(FakeGraph):
    """A graph that replays other values than its step: its first output is off by one."""

    def replay(self) -> None:
        super().replay()
        _tensors(self.out)[0].add_(1)
