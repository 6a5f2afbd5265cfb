"""Talker -> Code2Wav edge of Qwen3-Omni: how codec frames become audio windows.

Both ends use one plan so they agree on boundaries: the first window has `initial` frames, then
windows of `chunk` frames, each decoded with up to `left_context` frames before it and one frame of
lookahead after it (Code2Wav is causal except for a 555-sample lookahead; decoding one extra frame
and keeping exactly `frames * 1920` samples drops nothing). The last window is decoded without
lookahead and keeps everything, so the streamed audio has the full-decode length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from omnistream.errors import InvalidRequest

DEFAULT_CHUNK_FRAMES = 25
DEFAULT_LEFT_CONTEXT_FRAMES = 25
DEFAULT_INITIAL_FRAMES = 4


@dataclass(frozen=True)
class ChunkPlan:
    initial: int = DEFAULT_INITIAL_FRAMES
    chunk: int = DEFAULT_CHUNK_FRAMES
    left_context: int = DEFAULT_LEFT_CONTEXT_FRAMES

    def validate(self) -> ChunkPlan:
        if not 1 <= self.chunk <= 1024:
            raise InvalidRequest("codec chunk frames must be in [1, 1024]", field="chunk_frames")
        if not 1 <= self.initial <= self.chunk:
            raise InvalidRequest(
                f"initial codec chunk frames must be in [1, {self.chunk}]", field="initial_codec_chunk_frames"
            )
        if not 0 <= self.left_context <= 1024:
            raise InvalidRequest("left context frames must be in [0, 1024]", field="left_context_frames")
        return self

    def window_end(self, start: int) -> int:
        return self.initial if start == 0 else start + self.chunk

    def ready(self, start: int, available: int, done: bool) -> bool:
        """Can window [start, end) be decoded with `available` frames known so far?"""
        if done:
            return available > start
        return available > self.window_end(start)  # needs one frame of lookahead

    def span(self, start: int, available: int, done: bool) -> tuple[int, int, int, bool]:
        """(decode_from, end, decode_to, has_lookahead) for the window starting at `start`."""
        end = self.window_end(start)
        if done and available <= end:
            end = available
        context = min(self.left_context, start)
        lookahead = end < available
        return start - context, end, end + 1 if lookahead else end, lookahead


def dynamic_initial_frames(active: int, max_active: int, chunk: int = DEFAULT_CHUNK_FRAMES) -> int:
    """The anchor's load rule: small first chunks when idle (low TTFP), larger under load.

    steps = [2, 4, ..., largest power of two below `chunk`]; pick by load = active / max_active.
    """
    max_ic = 1
    while max_ic * 2 < chunk:
        max_ic *= 2
    steps = []
    step = 2
    while step <= max_ic:
        steps.append(step)
        step *= 2
    if not steps:
        return 1
    load = min(active / max(max_active, 1), 1.0)
    return steps[round(load * (len(steps) - 1))]


def frames_tensor(frames: list[list[int]], groups: int = 16) -> torch.Tensor:
    """Frames as the [groups, n] int64 tensor Code2Wav takes (n may be 0)."""
    if not frames:
        return torch.zeros((groups, 0), dtype=torch.long)
    return torch.tensor(frames, dtype=torch.long).T.contiguous()


@dataclass
class FrameShipper:
    """The talker side of a plan: collects frames and hands out each batch to ship as soon as the
    code2wav end can decode a window from it (window end + 1 lookahead frame, or the end)."""

    plan: ChunkPlan
    frames: list[list[int]] = field(default_factory=list)
    shipped: int = 0

    def __post_init__(self) -> None:
        self._points = flush_points(self.plan)
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


def flush_points(plan: ChunkPlan):
    """Frame counts at which the talker should ship what it has: each window end + 1 lookahead."""
    start = 0
    while True:
        end = plan.window_end(start)
        yield end + 1
        start = end
