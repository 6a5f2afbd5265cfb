"""Talker -> Code2Wav edge of Qwen3-Omni: how codec frames become audio windows.

Both ends use one plan so they agree on boundaries: the first window has `initial` frames, then
windows that double up to `chunk` frames (schedule "grow") or are `chunk` frames each ("fixed"; see
`chunk_plan`). Whatever the schedule, `ChunkPlan.window_end` is the only boundary rule. Code2Wav
streams exactly (`code2wav_stream`): a window is decoded once, as soon as its last frame is in, so
the talker ships at each window end. `left_context` is unused by that decode; it stays in the plan
and on the wire for the recompute baseline (the engine's `decode="recompute"`, which re-decodes up
to `left_context` frames before each window and needs one lookahead frame after it: its shipper is
built with `lookahead=1`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from omnistream.models.qwen3_omni.constants import NUM_CODEBOOKS
from omnistream.request.chunk_plan import (  # re-exported: the plan is this edge's contract
    DEFAULT_CHUNK_FRAMES,
    DEFAULT_INITIAL_FRAMES,
    DEFAULT_LEFT_CONTEXT_FRAMES,
    DEFAULT_SCHEDULE,
    SCHEDULES,
    ChunkPlan,
    dynamic_initial_frames,
)

__all__ = [
    "DEFAULT_CHUNK_FRAMES",
    "DEFAULT_INITIAL_FRAMES",
    "DEFAULT_LEFT_CONTEXT_FRAMES",
    "DEFAULT_SCHEDULE",
    "SCHEDULES",
    "ChunkPlan",
    "FrameShipper",
    "dynamic_initial_frames",
    "frames_tensor",
]


def frames_tensor(frames: list[list[int]], groups: int = NUM_CODEBOOKS) -> torch.Tensor:
    """Frames as the [groups, n] int64 tensor Code2Wav takes (n may be 0)."""
    if not frames:
        return torch.zeros((groups, 0), dtype=torch.long)
    return torch.tensor(frames, dtype=torch.long).T.contiguous()


@dataclass
class FrameShipper:
    """The talker side of a plan: collects frames and hands out each batch to ship as soon as the
    code2wav end can decode a window from it (the window end, + `lookahead` frames, or the end)."""

    plan: ChunkPlan
    frames: list[list[int]] = field(default_factory=list)
    shipped: int = 0
    lookahead: int = 0

    def __post_init__(self) -> None:
        self._points = flush_points(self.plan, self.lookahead)
        self._next = next(self._points)

    def due(self, finished: bool) -> bool:
        """Is it time to ship what has not been shipped yet?"""
        return finished or len(self.frames) >= self._next

    def take(self) -> tuple[int, torch.Tensor]:
        """(index of the first frame, the frames not shipped yet), marking them shipped."""
        first = self.shipped
        self.shipped = len(self.frames)
        while self._next <= self.shipped:
            self._next = next(self._points)
        return first, frames_tensor(self.frames[first:])


def flush_points(plan: ChunkPlan, lookahead: int = 0) -> Iterator[int]:
    """Frame counts at which the talker should ship what it has: each window end (+ lookahead)."""
    start = 0
    while True:
        end = plan.window_end(start)
        yield end + lookahead
        start = end
