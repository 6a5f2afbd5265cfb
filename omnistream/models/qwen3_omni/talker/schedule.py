"""Which talker requests take a step: earliest deadline first, under the prefill and frame budgets.

`DeadlineSchedule` is a part `TalkerEngine` holds: `pick` runs under the engine's lock and picks, by
when each request's listener runs dry (omnistream/engine/playout.py), the prompt rows to prefill (at
most `prefill_chunk` a step, fewer while a playing listener is near running dry), the free KV slots,
and the frame rows (`max_step_batch`); a request left out for a more urgent one is counted in the
step it returns. Its inputs are the slot pool and the EOS mask it assigns slots in, nothing else of
the engine, so tests build it with a fake pool and plain states.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from omnistream.engine.playout import buffered_seconds, by_deadline
from omnistream.models.qwen3_omni.talker.prompt import ASSISTANT_PROMPT_TOKENS, trailing_pick
from omnistream.models.qwen3_omni.talker.state import _TalkerState

# A listener with less audio than this left is near running dry: new prompts then prefill only as
# many rows a step as take SLACK_SHARE of that listener's audio left (at most MAX_PREFILL_SHARE_S), at
# the prefill's measured seconds per row (`prefill_row_seconds`); URGENT_PREFILL_ROWS before any
# prefill was measured, and at least that many. A fixed small row count instead prefilled a wave of
# simultaneous prompts one prompt every few steps, so the last of them started seconds late, while a
# whole wave's prompts took a fraction of one listener's slack (docs/benchmarks.md, run 6).
NEAR_DRY_S = 0.4
URGENT_PREFILL_ROWS = 32
MAX_PREFILL_SHARE_S = 0.2
SLACK_SHARE = 0.5


PREFILL_COST_WEIGHT = 0.2  # weight of the newest piece in the prefill's seconds-per-row average


class SlotPool(Protocol):
    """The KV slots the schedule hands to new prompts (`SlotKVCache`)."""

    @property
    def free_slots(self) -> int: ...

    def allocate(self) -> int: ...


class SlotFlags(Protocol):
    """Per-slot flags set when a request takes a slot (`EosMask`: does the request ignore EOS)."""

    def set(self, slot: int, ignore_eos: bool) -> None: ...


@dataclass
class TalkerStep:
    """One step's work: prompt pieces (request, rows), frames to finish (codebooks 1..15 of a pending
    codebook 0) and frames to start (the talker forward), plus what the step's metrics report."""

    prefill: list[tuple[_TalkerState, int]] = field(default_factory=list)
    predict: list[_TalkerState] = field(default_factory=list)
    decode: list[_TalkerState] = field(default_factory=list)
    deferred: int = 0  # requests that could have stepped but wait for more urgent ones
    buffered: tuple[float, ...] = ()  # audio seconds buffered by the requests the step runs


class DeadlineSchedule:
    """Earliest deadline first under the step's prefill rows, free slots and frame rows."""

    def __init__(
        self,
        slots: SlotPool,
        slot_flags: SlotFlags,
        prefill_chunk: int,
        max_step_batch: int,
    ) -> None:
        if prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be at least 1, got {prefill_chunk}")
        self.slots = slots
        self.slot_flags = slot_flags
        # Prompt rows prefilled per step, all requests together (at least one piece a step).
        self.prefill_chunk = prefill_chunk
        # Requests that take a frame step per step, most urgent first (the rest wait a step).
        self.max_step_batch = max_step_batch
        # Measured: seconds of prefill per prompt row (None: not yet), a moving average over pieces.
        self.prefill_row_seconds: float | None = None

    @staticmethod
    def text_row_ready(state: _TalkerState) -> bool:
        """Is the request's next frame's text row known?"""
        # Frame k+1 consumes assistant-stream token 4 + k once it is known not to be the thinker's
        # last token (a later one came, or the input ended), else tts_eos / tts_pad (prompt.py).
        index = ASSISTANT_PROMPT_TOKENS + state.frames - 1
        return trailing_pick(state.stream, state.input_done, index) is not None

    def pick(self, candidates: Sequence[_TalkerState], now: float | None = None) -> TalkerStep | None:
        """Under the engine's lock: the step's work among `candidates`, or None when none can progress.
        New prompts' slots are allocated here (and their EOS flag set)."""
        if now is None:
            now = time.monotonic()
        step = TalkerStep()
        rows = self.prefill_budget(candidates, now)  # prefill budget of this step
        free = self.slots.free_slots
        room = self.max_step_batch  # requests that may take a frame step
        for state in by_deadline(list(candidates)):
            if state.finished or not state.output.has_room():
                continue
            if not state.prefill_done:
                if rows <= 0:
                    continue
                if state.slot is None:
                    ready = state.prompt_ids is not None and len(state.stream) >= ASSISTANT_PROMPT_TOKENS
                    if not ready or free <= 0:
                        continue
                    free -= 1
                # Only what the prompt has left: the rest of the budget goes to the next new prompt
                # (a wave of new streams is prefilled in a few steps, not one step each).
                total = state.prompt_row_count or rows
                take = min(rows, max(total - state.prefilled, 1))
                rows -= take
                step.prefill.append((state, take))
            elif state.pending_code0 is not None or self.text_row_ready(state):
                if room <= 0:  # the step is full of more urgent requests: this one waits a step
                    step.deferred += 1
                    continue
                room -= 1
                (step.predict if state.pending_code0 is not None else step.decode).append(state)
        for state, _ in step.prefill:
            if state.slot is None:
                state.slot = self.slots.allocate()
                self.slot_flags.set(state.slot, state.params.ignore_eos)
        if not (step.prefill or step.predict or step.decode):
            return None
        step.buffered = buffered_seconds([s for s, _ in step.prefill] + step.predict + step.decode, now)
        return step

    def prefill_budget(self, candidates: Sequence[_TalkerState], now: float) -> int:
        """Prompt rows this step may prefill. New requests' prompts are work for listeners still far
        from running dry: while one that is already playing has less than `NEAR_DRY_S` left, the
        step's prefill takes at most a share of what it has left, so the step that brings its next
        frame stays short (module constants)."""
        slack = self.least_buffered(candidates, now)
        if slack is None or slack >= NEAR_DRY_S:
            return self.prefill_chunk
        per_row = self.prefill_row_seconds
        if not per_row:
            return min(self.prefill_chunk, URGENT_PREFILL_ROWS)
        share = min(MAX_PREFILL_SHARE_S, SLACK_SHARE * max(slack, 0.0))
        return min(self.prefill_chunk, max(URGENT_PREFILL_ROWS, int(share / per_row)))

    @staticmethod
    def least_buffered(candidates: Sequence[_TalkerState], now: float) -> float | None:
        """Audio seconds left to the playing listener nearest to running dry (None: none plays)."""
        left = [
            s.playout.buffered(now)
            for s in candidates
            if not s.finished and s.prefill_done and s.playout.first_output is not None
        ]
        return min(left) if left else None

    def measure_prefill(self, rows: int, seconds: float) -> None:
        """Seconds per prompt row of prefill, a moving average over pieces (the prefill budget while a
        listener is near running dry)."""
        if rows <= 0:
            return
        sample = seconds / rows
        last = self.prefill_row_seconds
        self.prefill_row_seconds = sample if last is None else last + PREFILL_COST_WEIGHT * (sample - last)
