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

# A listener with less audio than this left is near running dry: new prompts then prefill at most
# URGENT_PREFILL_ROWS rows a step (a stream's first 2-frame chunk plays 137 ms; a step prefilling
# several 100-row prompts took about that long here).
NEAR_DRY_S = 0.4
URGENT_PREFILL_ROWS = 32


class DeadlineSchedule:
    """The scheduling half of `TalkerEngine`."""

    cache: Any  # SlotKVCache
    stats: Any  # EngineStats
    prefill_chunk: int
    max_step_batch: int

    def _text_row_ready(self, state: _TalkerState) -> bool:
        # Frame k+1 consumes assistant-stream token 4 + k once it is known not to be the thinker's
        # last token (a later one came, or the input ended), else tts_eos / tts_pad (prompt.py).
        index = ASSISTANT_PROMPT_TOKENS + state.frames - 1
        return trailing_pick(state.stream, state.input_done, index) is not None

    def _schedule(self, candidates):
        now = time.monotonic()
        prefill: list[tuple[_TalkerState, int]] = []  # (request, rows it may prefill this step)
        predict, decode = [], []
        rows = self.prefill_chunk  # prefill budget of this step
        if self._listener_near_dry(candidates, now):
            # New requests' prompts are work for listeners still far from running dry: while one
            # that is already playing has little left, they get a small piece a step, so the step
            # that brings its next frame stays short.
            rows = min(rows, URGENT_PREFILL_ROWS)
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
                if state.prompt_rows is None:  # its row count is known once its rows are built
                    take = rows
                else:
                    take = min(rows, state.prompt_rows.shape[1] - state.prefilled)
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

    def _listener_near_dry(self, candidates, now: float) -> bool:
        """Is a request that has started playing within `NEAR_DRY_S` of running dry?"""
        return any(
            s.prefill_done and s.playout.first_output is not None and s.playout.buffered(now) < NEAR_DRY_S
            for s in candidates
            if not s.finished
        )
