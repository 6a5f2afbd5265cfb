"""A stage's measured speed: a rolling measure of its engine's steps, reported in its Info.

The gateway decides whether one more audio stream fits (gateway/admission/audio_capacity.py) from what the
stages really sustain on their hardware, not from a configured guess. The measure belongs here, at
the stage: only the engine knows how long its steps take and how much each produced, and the
gateway reads the summary with the Info it already polls (no per-step RPC).

`capacity_per_second` is units per second of *busy* time (the steps' own wall times): an engine
that waits for input (a talker paced by the thinker's text, a code2wav by the talker's frames) is
not slow, so idle time must not count against it. `output_per_second` is what it produced per
second of wall time, for dashboards. When the engine has been idle for longer than the window the
last `min_steps` steps still stand: the hardware did not get slower by resting, and a measure that
vanished whenever a deployment went quiet would let a burst in unchecked.

Beside the rolling sums, the meter keeps the step-time model (omnistream/service/step_model.py):
how long a step of each size takes, seeded by the warm-up probe, so the gateway can ask what the
stage sustains at the batch one more stream would make, not only at today's.

Torch-free: the step listener only reads `EngineStats` numbers.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omnistream.service.step_model import StepFit, StepTimeModel

if TYPE_CHECKING:
    from omnistream.engine.api import StageEngine

WINDOW_SECONDS = 5.0
MIN_STEPS = 16  # steps kept past the window, so a quiet engine still has a measure
MAX_STEPS = 4096  # bound of the step record (a busy engine runs hundreds of steps a second)


@dataclass(frozen=True)
class Speed:
    """One reading of the meter (the fields of StageLoad in stage.proto)."""

    capacity_per_second: float
    output_per_second: float
    mean_batch: float
    busy_fraction: float
    measured_steps: int
    window_seconds: float
    fit: StepFit | None = None  # the step-time model (None: nothing measured or seeded)


@dataclass(frozen=True)
class _Step:
    ended: float  # clock time at the end of the step
    seconds: float
    units: int
    batch: int


class SpeedMeter:
    """Step listener (`engine.add_step_listener(meter)`) keeping the recent steps; `speed()` sums
    them. Runs on the engine thread (append only: O(1)); `speed()` runs on the event loop."""

    def __init__(
        self,
        window: float = WINDOW_SECONDS,
        min_steps: int = MIN_STEPS,
        max_steps: int = MAX_STEPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window = window
        self.min_steps = min_steps
        self._clock = clock
        self._steps: deque[_Step] = deque(maxlen=max_steps)
        self._model = StepTimeModel()
        self._lock = threading.Lock()

    def __call__(self, engine: StageEngine, seconds: float) -> None:
        stats = engine.stats
        step = _Step(self._clock(), seconds, stats.last_units, stats.last_batch_size)
        with self._lock:
            self._steps.append(step)
            if not stats.last_prefill_rows:
                self._model.observe(stats.last_units, stats.last_batch_size, seconds)

    def reset(self) -> None:
        """Forget the steps (after warm-up: its first steps include one-off compilation and
        allocation, far slower than serving); the model's seed stays."""
        with self._lock:
            self._steps.clear()
            self._model.clear_live()

    def seed(self) -> None:
        """The steps since the last reset (the warm-up probe's) seed the step-time model, and the
        rolling measure starts anew."""
        with self._lock:
            self._model.seed_from_live()
            self._steps.clear()

    def speed(self) -> Speed:
        now = self._clock()
        since = now - self.window
        with self._lock:
            steps = list(self._steps)
            fit = self._model.fit()
        recent = [s for s in steps if s.ended >= since]
        measured = recent if len(recent) >= self.min_steps else steps[-self.min_steps :]
        busy = sum(s.seconds for s in measured)
        units = sum(s.units for s in measured)
        batched = [s.batch for s in measured if s.batch]
        # Only the part of each recent step inside the window is busy time of the window.
        busy_in_window = sum(min(s.seconds, s.ended - since) for s in recent)
        return Speed(
            capacity_per_second=units / busy if busy > 0 else 0.0,
            output_per_second=sum(s.units for s in recent) / self.window,
            mean_batch=sum(batched) / len(batched) if batched else 0.0,
            busy_fraction=min(1.0, busy_in_window / self.window),
            measured_steps=len(measured),
            window_seconds=self.window,
            fit=fit,
        )
