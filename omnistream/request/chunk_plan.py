"""The talker -> Code2Wav chunk plan and its load rule, without torch (the gateway chooses plans).

See `codec_chunks` for how the two ends use it. `left_context` only serves the recompute baseline;
the exact streaming Code2Wav ignores it (it stays on the wire so old and new peers interoperate).

Schedules (`ChunkPlan.schedule`), i.e. how long each window after the first one is:

* ``"grow"`` (the default): each window after the first is as long as all the windows before it,
  capped at ``chunk``: ``initial, initial, 2*initial, 4*initial, ...`` (2, 2, 4, 8, 16, 25, 25, ...
  for initial 2, chunk 25), so the audio doubles with each window. A window is ready before the
  audio already sent has played out whenever audio is made faster than real time (the second
  window, as long as the first, needs only ~1.2x to beat the first one's 137 ms less the decoder's
  trim). Plain doubling (2, 4, 8, ...) asks for the second window twice the first's length: a
  stream's first half second is its slowest (its own and its neighbours' prefills), and at ~2x
  there the 4-frame second window came ~35 ms after the first 137 ms had played. With a fixed
  schedule the 2-frame first chunk plays out long before the 25-frame second one exists, so nearly
  every answer stalled ~100 ms after its first syllable. The exact streaming Code2Wav decodes any
  window length exactly, so the schedule changes when audio arrives, never what it is.
* ``"fixed"``: ``initial``, then ``chunk`` frames per window: what every peer did before schedules
  existed (and what an open without a schedule on the wire still means), kept for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from omnistream.request.errors import InvalidRequest

DEFAULT_CHUNK_FRAMES = 25
DEFAULT_LEFT_CONTEXT_FRAMES = 25
DEFAULT_INITIAL_FRAMES = 4
# Code2Wav's frames per step as served (serve code2wav --max-step-frames): four full windows. Its
# step time grows with its frames, so this bounds how long the most urgent window waits behind a
# step of others' (the gateway's first-chunk sizing counts it: gateway/admission/audio_capacity.py).
DEFAULT_CODE2WAV_STEP_FRAMES = 4 * DEFAULT_CHUNK_FRAMES
SCHEDULE_GROW = "grow"
SCHEDULE_FIXED = "fixed"
SCHEDULES = (SCHEDULE_GROW, SCHEDULE_FIXED)
DEFAULT_SCHEDULE = SCHEDULE_GROW


@dataclass(frozen=True)
class ChunkPlan:
    """Where one request's codec windows end, agreed by the talker (it ships at each end) and code2wav
    (it decodes one window per audio chunk): the first has `initial` frames, the rest follow
    `schedule` up to `chunk`. Chosen once per request at the open and never changed mid-request."""

    initial: int = DEFAULT_INITIAL_FRAMES
    chunk: int = DEFAULT_CHUNK_FRAMES
    left_context: int = DEFAULT_LEFT_CONTEXT_FRAMES
    schedule: str = DEFAULT_SCHEDULE  # see the module docstring; fixed per request at the open

    def validate(self) -> ChunkPlan:
        if self.schedule not in SCHEDULES:
            raise InvalidRequest(
                f"codec chunk schedule must be one of {', '.join(SCHEDULES)}, not {self.schedule!r}",
                field="codec_chunk_schedule",
            )
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
        """The end frame of the window that starts at frame `start` (a window end, or 0).

        Grow: walk the windows (each as long as all before it) until the one that holds `start`
        (at most log2(chunk) steps); once they reach `chunk` every later window is `chunk` long, as
        in the fixed schedule. A `start` inside a window (no caller makes one) gets that window's
        length.
        """
        if self.schedule == SCHEDULE_FIXED:
            return self.initial if start == 0 else start + self.chunk
        begin, length = 0, min(self.initial, self.chunk)
        while length < self.chunk and begin + length <= start:
            begin += length
            length = min(begin, self.chunk)
        return start + length

    def window_lengths(self, count: int) -> list[int]:
        """The first `count` window lengths (for logs, docs and tests)."""
        lengths, start = [], 0
        for _ in range(count):
            end = self.window_end(start)
            lengths.append(end - start)
            start = end
        return lengths

    def windows(self, frames: int) -> list[int]:
        """The window lengths an answer of `frames` frames is decoded in (one audio chunk each on
        the exact stream), the last one cut short at the end."""
        lengths, start = [], 0
        while start < frames:
            end = min(self.window_end(start), frames)
            lengths.append(end - start)
            start = end
        return lengths

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
