"""Which talker requests take a step: earliest deadline first, under the prefill and frame budgets.

A mixin of `TalkerEngine`: `_schedule` runs under the engine's lock and picks, by when each
request's listener runs dry (omnistream/engine/playout.py), the prompt rows to prefill (at most
`prefill_chunk` a step, fewer while a playing listener is near running dry), the free KV slots,
and the frame rows (`max_step_batch`); a request left out for a more urgent one is counted.
"""

from __future__ import annotations

import time
from typing import Any

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


class DeadlineSchedule:
    """The scheduling half of `TalkerEngine`."""

    cache: Any  # SlotKVCache
    stats: Any  # EngineStats
    prefill_chunk: int
    max_step_batch: int
    prefill_row_seconds: float | None  # measured: seconds of prefill per prompt row (None: not yet)

    def _text_row_ready(self, state: _TalkerState) -> bool:
        # Frame k+1 consumes assistant-stream token 4 + k once it is known not to be the thinker's
        # last token (a later one came, or the input ended), else tts_eos / tts_pad (prompt.py).
        index = ASSISTANT_PROMPT_TOKENS + state.frames - 1
        return trailing_pick(state.stream, state.input_done, index) is not None

    def _schedule(self, candidates):
        now = time.monotonic()
        prefill: list[tuple[_TalkerState, int]] = []  # (request, rows it may prefill this step)
        predict, decode = [], []
        rows = self._prefill_budget(candidates, now)  # prefill budget of this step
        free = self.cache.free_slots
        room = self.max_step_batch  # requests that may take a frame step
        deferred = 0
        for state in by_deadline(candidates):
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
                prefill.append((state, take))
            elif state.pending_code0 is not None or self._text_row_ready(state):
                if room <= 0:  # the step is full of more urgent requests: this one waits a step
                    deferred += 1
                    continue
                room -= 1
                (predict if state.pending_code0 is not None else decode).append(state)
        for state, _ in prefill:
            if state.slot is None:
                state.slot = self.cache.allocate()
                self.eos_mask.set(state.slot, state.params.ignore_eos)
        if not (prefill or predict or decode):
            return None
        self._deferred(deferred)
        self.stats.last_buffered = buffered_seconds([s for s, _ in prefill] + predict + decode, now)
        return prefill, predict, decode

    def _prefill_budget(self, candidates, now: float) -> int:
        """Prompt rows this step may prefill. New requests' prompts are work for listeners still far
        from running dry: while one that is already playing has less than `NEAR_DRY_S` left, the
        step's prefill takes at most a share of what it has left, so the step that brings its next
        frame stays short (module constants)."""
        slack = self._least_buffered(candidates, now)
        if slack is None or slack >= NEAR_DRY_S:
            return self.prefill_chunk
        per_row = self.prefill_row_seconds
        if not per_row:
            return min(self.prefill_chunk, URGENT_PREFILL_ROWS)
        share = min(MAX_PREFILL_SHARE_S, SLACK_SHARE * max(slack, 0.0))
        return min(self.prefill_chunk, max(URGENT_PREFILL_ROWS, int(share / per_row)))

    def _least_buffered(self, candidates, now: float) -> float | None:
        """Audio seconds left to the playing listener nearest to running dry (None: none plays)."""
        left = [
            s.playout.buffered(now)
            for s in candidates
            if not s.finished and s.prefill_done and s.playout.first_output is not None
        ]
        return min(left) if left else None
