"""A stage's step time as a function of its batch: t(u) = base + per_unit x u for a step making u units.

Why a model and not one number: a batched step makes more units a second than a small one (the
per-step cost, weights read once and host overhead, is shared by every row), so a speed measured at
today's batch says too little about the batch one more stream would make. The gateway's audio
admission used exactly that number and so held itself down: admitted few streams, measured at
that small batch, and admitted few again (gateway/admission/audio_capacity.py).

The line is fitted to the steps the engine really runs (per unit count, the median of its recent
step times: a step that also prefilled a prompt or ran late once does not move it) and seeded by
a probe at warm-up that runs batches up to `max_batch` (omnistream/models/qwen3_omni/warmup.py):
a stage that has only run small batches still knows its larger ones. Where serving is slower than
the probe (other processes share the cores), the seed points are scaled by how much slower the
live steps are than the seed line predicts at their own sizes, so the seed keeps its shape and
takes the live level.

Live steps age out: a step size counts only with steps seen in the last `LIVE_MAX_AGE_S` (a stage
that ran no step for that long keeps all it has: its last level is still the best known). Steps
run while other work held the cores (a wave of prompts prefilling in the thinker's process beside
the talker) are slow; kept until their size was seen again, a wave's sizes kept the level of its
worst second long after it, so admission assumed a fraction of the speed the stage then measured
(a talker said to make 57 frames/s at 4 streams while it made 190-260) and held itself down again.

Torch-free and pure: the numbers come from the step listener (omnistream/service/speed.py).
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

SAMPLES_PER_SIZE = 32  # recent step times kept per unit count
MAX_SIZES = 256  # unit counts kept (least recently seen dropped first)
SEED_WEIGHT = 4.0  # a seed point counts as this many live steps
LIVE_WEIGHT_CAP = 32.0
MIN_SLOWDOWN, MAX_SLOWDOWN = 0.25, 20.0  # bounds of the live/seed level factor
LIVE_MAX_AGE_S = 30.0  # a live step older than this no longer counts (module docstring)


@dataclass(frozen=True)
class StepFit:
    """t(u) = base_seconds + unit_seconds x u; `units_per_row`: what one request adds to a step."""

    base_seconds: float
    unit_seconds: float
    units_per_row: float
    points: int  # distinct unit counts the fit stands on (seed and live)
    slowdown: float = 1.0  # live level over the seed's (1.0 without either)

    def step_seconds(self, units: float) -> float:
        return self.base_seconds + self.unit_seconds * units

    def row_rate(self, rows: int) -> float:
        """Units a second each of `rows` requests sharing every step gets."""
        per_row = self.units_per_row
        seconds = self.step_seconds(max(rows, 1) * per_row)
        return per_row / seconds if seconds > 0 else 0.0


def fit_line(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Weighted least squares of (x, y, weight) to y = a + b x with a, b >= 0 (a step has a cost
    and a larger one is never cheaper). One distinct x: through the origin, the cautious reading
    (no sharing assumed). Larger steps measured faster (noise, e.g. a probe run while other work
    held the cores): through the origin at the highest cost per unit measured, cautious again (a
    flat line would say every stream added is free)."""
    total = sum(w for _, _, w in points)
    if total <= 0:
        return 0.0, 0.0
    mx = sum(w * x for x, _, w in points) / total
    my = sum(w * y for _, y, w in points) / total
    sxx = sum(w * (x - mx) ** 2 for x, _, w in points)
    if sxx > 0:
        b = sum(w * (x - mx) * (y - my) for x, y, w in points) / sxx
        a = my - b * mx
        if b < 0:
            return 0.0, max((y / x for x, y, _ in points if x > 0), default=0.0)
        if a >= 0:
            return a, b
    sxx0 = sum(w * x * x for x, _, w in points)
    return 0.0, (sum(w * x * y for x, y, w in points) / sxx0 if sxx0 > 0 else 0.0)


class StepTimeModel:
    """Step times per unit count, live and seeded; `fit()` the line through them. Not thread-safe:
    the speed meter holds its lock around every call."""

    def __init__(
        self,
        samples_per_size: int = SAMPLES_PER_SIZE,
        max_sizes: int = MAX_SIZES,
        max_age: float = LIVE_MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.samples_per_size = samples_per_size
        self.max_sizes = max_sizes
        self.max_age = max_age
        self._clock = clock
        self._live: OrderedDict[int, deque[tuple[float, float]]] = OrderedDict()  # (when, seconds)
        self._rows: deque[float] = deque(maxlen=samples_per_size * 4)  # units per row, recent steps
        self._seed: dict[int, float] = {}
        self._seed_units_per_row: float | None = None

    def observe(self, units: int, rows: int, seconds: float) -> None:
        """One step that made `units` units for `rows` requests (no prompt prefilled in it)."""
        if units <= 0 or rows <= 0 or seconds <= 0:
            return
        times = self._live.pop(units, None)
        if times is None:
            times = deque(maxlen=self.samples_per_size)
            if len(self._live) >= self.max_sizes:
                self._live.popitem(last=False)
        times.append((self._clock(), seconds))
        self._live[units] = times
        self._rows.append(units / rows)

    def seed_from_live(self) -> None:
        """What was observed so far (the warm-up probe) becomes the seed; live starts empty."""
        if self._live:
            self._seed = {u: statistics.median(s for _, s in t) for u, t in self._live.items()}
            self._seed_units_per_row = statistics.median(self._rows) if self._rows else None
        self.clear_live()

    def clear_live(self) -> None:
        self._live.clear()
        self._rows.clear()

    @property
    def seeded(self) -> bool:
        return bool(self._seed)

    def fit(self) -> StepFit | None:
        """The line through the live and seed points (None: neither has any)."""
        since = self._clock() - self.max_age
        if not any(samples[-1][0] >= since for samples in self._live.values()):
            since = -float("inf")  # a quiet stage: its last level is still the best known
        live = {}
        for u, samples in self._live.items():
            recent = [seconds for when, seconds in samples if when >= since]
            if recent:
                live[u] = (statistics.median(recent), min(len(recent), LIVE_WEIGHT_CAP))
        if not live and not self._seed:
            return None
        slowdown = 1.0
        seed_points: list[tuple[float, float, float]] = []
        if self._seed:
            a0, b0 = fit_line([(u, t, 1.0) for u, t in self._seed.items()])
            ratios = [m / (a0 + b0 * u) for u, (m, _) in live.items() if a0 + b0 * u > 0]
            if ratios:
                slowdown = min(max(statistics.median(ratios), MIN_SLOWDOWN), MAX_SLOWDOWN)
            seed_points = [(u, t * slowdown, SEED_WEIGHT) for u, t in self._seed.items() if u not in live]
        points = [(u, m, w) for u, (m, w) in live.items()] + seed_points
        base, per_unit = fit_line(points)
        per_row = statistics.median(self._rows) if self._rows else self._seed_units_per_row or 1.0
        return StepFit(base, per_unit, per_row, len(points), slowdown)
