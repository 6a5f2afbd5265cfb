"""The talker -> Code2Wav chunk plan and its load rule, without torch (the gateway chooses plans).

See `codec_chunks` for how the two ends use it. `left_context` only serves the recompute baseline;
the exact streaming Code2Wav ignores it (it stays on the wire so old and new peers interoperate).
"""

from __future__ import annotations

from dataclasses import dataclass

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
        """Recompute baseline: can window [start, end) be decoded with `available` frames so far?
        (The exact stream needs no lookahead: a window is ready at its end.)"""
        if done:
            return available > start
        return available > self.window_end(start)  # needs one frame of lookahead

    def span(self, start: int, available: int, done: bool) -> tuple[int, int, int, bool]:
        """Recompute baseline: (decode_from, end, decode_to, has_lookahead) for the window at `start`."""
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
