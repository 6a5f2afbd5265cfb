"""Audio admission by measured speed: protect the listeners already playing.

Every listener consumes `frame_rate` codec frames a second (12.5 for Qwen3-Omni). The talker and
code2wav report what they sustain (`StageInfo.load`, omnistream/service/speed.py) as a step-time
model (omnistream/service/step_model.py): a step making u units takes t(u) = base + per_unit x u,
fitted to the steps they run and seeded by a probe at warm-up up to their max batch, and each
request adds `units_per_row` units to a step (the talker one frame, code2wav its window's frames).
n streams sharing a replica's steps then each get

    rate(n) = units_per_row / t(n x units_per_row)

frames a second: a larger batch makes each step longer but by less than the batch, since the
step's own cost is shared. This is the capacity at the batch the new stream would make, not at
today's: a speed measured at today's batch, assumed to fall as 1 / n beyond it (what this module
did before the model, and still does for a stage that reports no model), held itself down, since
few admitted streams measured a small batch, which admitted few again. With R replicas of a stage
the streams spread evenly (least-loaded choice), n = ceil(S / R), and the slowest replica counts;
the tighter of the two audio stages counts. The headroom of S streams is how many times faster
than real time each is produced:

    headroom(S) = min over audio stages and their replicas of rate(ceil(S / R)) / frame_rate

* admit: one more stream starts when `headroom(S + 1) >= 1 + margin` (S streams running), or when
  no audio stream runs (one stream cannot make another stutter, and it is what refreshes a stale
  measure), or when the speed is unknown (old stages, nothing measured yet): today's behaviour.
  Otherwise the request waits in the audio hold queue (gateway/admission/permits.py) until a stream ends or
  a new measure allows it.
* first chunk: the smallest of the load rule's sizes (2, 4, 8, 16 for 25-frame chunks) under
  which the listener, as predicted, never waits: frames come at `headroom x frame_rate` a second,
  each window of the request's plan (fixed or growing, chunk_plan.py) arrives once its last frame
  is made, the first one's audio is shorter by what the streaming decoder holds back, and the
  listener model (omnistream/audio/listener.py) plays the predicted arrivals. Under the fixed schedule
  that is `initial >= chunk / headroom` (the second, full-size window must be made while the first
  plays); a growing schedule keeps the first chunk small down to a headroom of about 1.7. The
  largest size when none suffices.
* start jitter: the prediction has every window after the first arrive `jitter` seconds later
  still (0.1 s by default, `--audio-start-jitter`, plus 0.0125 s for each other audio stream,
  `--audio-start-jitter-per-stream`: at 16 streams started together on the 2-core machine their
  early windows came ~0.25 s late, docs/benchmarks.md run 6). Speed is measured over many steps; a stream's
  first second is when one step or one message runs late (its own and its neighbours' text decode
  and prefill share the cores with it), and a 2-frame first chunk (137 ms of audio) has nothing in
  hand for that. Measured on the 2-core machine with per-stage timestamps: a starting stream's
  second window came 40-170 ms later than its speed predicted in about one request of 16 at
  concurrency 4, which then stalled with the 2-frame first chunk the prediction allowed (it had
  ~10 ms to spare). With the allowance a stream starts with 2 frames only at a headroom of about
  4.6 or more (one stream alone, on this machine: TTFP unchanged) and with 4 below it.

Torch-free and pure: the numbers come from the replicas (`replica_speeds`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from omnistream.audio.listener import AudioArrival, listen
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.service.step_model import StepFit

if TYPE_CHECKING:  # only annotated: the config imports this module's defaults, not the replicas
    from gateway.cluster.replica import Replica
    from omnistream.proto.omni.v1 import stage_pb2

DEFAULT_FRAME_RATE = 12.5  # Qwen3-Omni's codec frames per second, when no stage said
DEFAULT_MARGIN = 0.2  # hold while each stream would be produced less than 1.2x faster than real time
AUDIO_STAGES = ("talker", "code2wav")
# What the exact streaming Code2Wav keeps back of a stream's first window until the next one (555
# samples at 24 kHz for Qwen3-Omni, rounded up): the first chunk plays that much shorter.
FIRST_CHUNK_HOLDBACK_S = 0.025
DEFAULT_START_JITTER_S = 0.1  # how late a starting stream's later windows may come (module docstring)
DEFAULT_START_JITTER_PER_STREAM_S = 0.0125  # ... and more for each other stream sharing the stages
PREDICTED_WINDOWS = 8  # windows of the plan the prediction plays: past the growth, sizes repeat


@dataclass(frozen=True)
class ReplicaSpeed:
    """One replica's measure: `capacity` units per busy second at mean batch `batch`, and its
    step-time model when it reports one (then the model decides: module docstring)."""

    capacity: float
    batch: float = 1.0
    model: StepFit | None = None  # the stage's step-time model as it reported it

    def stream_rate(self, streams: int) -> float:
        """Units a second each of `streams` in its batch gets (module docstring). A model never
        says less than the speed measured now shared by them, once they are at least today's batch:
        a larger batch never makes fewer units a second, so the measure is a floor the model's
        extrapolation (its slowdown, a fit standing on slow steps) cannot hold admission under."""
        shared = self.capacity / max(streams, self.batch, 1.0)
        if self.model is None:
            return shared
        modelled = self.model.row_rate(streams)
        return max(modelled, shared) if streams >= self.batch else modelled

    def capacity_at(self, streams: int) -> float:
        """Units per busy second of the replica with `streams` in its batch."""
        return max(streams, 1) * self.stream_rate(streams)


def replica_speed(load: stage_pb2.StageLoad | None) -> ReplicaSpeed | None:
    """One replica's StageLoad as a speed (None: nothing measured or seeded yet, or an old stage
    that reports nothing)."""
    if load is None:
        return None
    model = None
    if load.model_points > 0 and (load.step_base_seconds > 0 or load.step_unit_seconds > 0):
        model = StepFit(
            load.step_base_seconds,
            load.step_unit_seconds,
            load.units_per_row or 1.0,
            load.model_points,
            load.model_slowdown or 1.0,
        )
    measured = load.measured_steps > 0 and load.capacity_per_second > 0
    if model is None and not measured:
        return None
    return ReplicaSpeed(load.capacity_per_second if measured else 0.0, load.mean_batch, model)


def replica_speeds(replicas: Iterable[Replica]) -> list[ReplicaSpeed] | None:
    """The speeds of a stage's replicas in rotation; None when any of them has none (an old
    stage, a failed read, nothing run or probed since warm-up) or none is in rotation: a stage
    judged by part of its replicas would get the streams of all of them."""
    speeds = []
    for replica in replicas:
        if not replica.in_rotation:
            continue
        speed = replica_speed(replica.load)
        if speed is None:
            return None
        speeds.append(speed)
    return speeds or None


def measured_capacity(replicas: Iterable[Replica]) -> float | None:
    """A stage's units per busy second as measured at its current batch, summed over its replicas
    in rotation (None: unknown)."""
    speeds = replica_speeds(replicas)
    return None if speeds is None else sum(s.capacity for s in speeds)


def assumed_capacity(replicas: Iterable[Replica], streams: int) -> float | None:
    """A stage's units per busy second with `streams` spread over its replicas in rotation, as its
    step-time model says (the capacity admission assumes; None: unknown)."""
    speeds = replica_speeds(replicas)
    if speeds is None:
        return None
    each = math.ceil(max(streams, 1) / len(speeds))
    return sum(s.capacity_at(each) for s in speeds)


@dataclass(frozen=True)
class AudioCapacity:
    """What the audio stages with a known speed sustain (no stage known: unknown)."""

    stages: tuple[tuple[ReplicaSpeed, ...], ...] = ()
    frame_rate: float = DEFAULT_FRAME_RATE

    @classmethod
    def of(cls, stages: Iterable[Sequence[ReplicaSpeed] | None], frame_rate: float | None) -> AudioCapacity:
        """From each audio stage's replica speeds (None: that stage's speed is unknown, and the
        stages that are known decide)."""
        known = tuple(tuple(s) for s in stages if s)
        return cls(known, frame_rate or DEFAULT_FRAME_RATE)

    def headroom(self, streams: int) -> float | None:
        """How many times faster than real time each of `streams` would be produced, at worst;
        None when no audio stage's speed is known."""
        if not self.stages:
            return None
        if streams <= 0:
            return math.inf
        rate = min(
            min(r.stream_rate(math.ceil(streams / len(replicas))) for r in replicas)
            for replicas in self.stages
        )
        return rate / self.frame_rate

    def admits(self, running: int, margin: float = DEFAULT_MARGIN, need: float | None = None) -> bool:
        """May one more audio stream start beside `running` ones? `need`: the headroom the fragile
        (starting) ones among them need kept (the start guard, start_guard.py): one more must leave
        them that, and with the speed unknown it waits for them to settle."""
        headroom = self.headroom(running + 1)
        if need is not None and (headroom is None or headroom < need):
            return False
        return running == 0 or headroom is None or headroom >= 1.0 + margin


def chunk_sizes(chunk: int) -> list[int]:
    """The first-chunk sizes of `dynamic_initial_frames`: 2, 4, ... up to the largest power of two
    below `chunk` (just [1] for a chunk too small for any)."""
    sizes = []
    size = 2
    while size < chunk:
        sizes.append(size)
        size *= 2
    return sizes or [1]


def predicted_stalls(
    headroom: float,
    plan: ChunkPlan,
    frame_rate: float = DEFAULT_FRAME_RATE,
    pause: float = 0.0,
    jitter: float = 0.0,
    head_start: float = 0.0,
) -> int:
    """Stalls the listener model predicts for a stream made `headroom` times faster than real time
    and cut into `plan`'s windows (module docstring), over its first `PREDICTED_WINDOWS` windows;
    every window after the first arrives `pause + jitter` seconds later still (`pause`: the other
    streams' work that runs between two of this one's, `code2wav_pause`; `jitter`: the start
    jitter allowance). `head_start`: the listener starts no sooner than this (a held speculation,
    released then), with whatever arrived by then in hand."""
    if headroom <= 0:
        return PREDICTED_WINDOWS
    made = headroom * frame_rate  # frames a second
    rate = 24_000  # any rate: the prediction is in seconds
    arrivals, end = [], 0
    for index, length in enumerate(plan.window_lengths(PREDICTED_WINDOWS)):
        end += length
        seconds = length / frame_rate - (FIRST_CHUNK_HOLDBACK_S if index == 0 else 0.0)
        arrival = end / made + pause + jitter if index else max(end / made, head_start)
        arrivals.append(AudioArrival(arrival, max(0, round(seconds * rate)), rate))
    return listen(arrivals).stalls


def code2wav_pause(
    streams: int, chunk: int, code2wav_capacity: float | None, step_frames: int | None = None
) -> float:
    """How long a new stream's next window may wait behind the others' at Code2Wav: the step in
    progress when it becomes ready, at most one full window of each other stream (`chunk` frames)
    and at most the stage's frames per step (`step_frames`, its StageLimits.max_step_frames: after
    that step the most urgent window goes first), at its frames per busy second (0 when unknown).
    A stream's first windows are its most fragile: on a loaded 2-core machine a prediction from
    speed alone kept 2-frame first chunks that then ran dry at concurrency 10-16."""
    if not code2wav_capacity or code2wav_capacity <= 0 or streams <= 1:
        return 0.0
    frames = (streams - 1) * chunk
    if step_frames:
        frames = min(frames, step_frames)
    return frames / code2wav_capacity


def initial_frames_for(
    headroom: float,
    chunk: int,
    schedule: str = "grow",
    frame_rate: float = DEFAULT_FRAME_RATE,
    pause: float = 0.0,
    jitter: float = DEFAULT_START_JITTER_S,
    head_start: float = 0.0,
) -> int:
    """The smallest first chunk of the load rule's sizes under which the predicted listener never
    waits, with `jitter` to spare (module docstring); the largest when none does."""
    sizes = chunk_sizes(chunk)
    for size in sizes:
        plan = ChunkPlan(size, chunk, schedule=schedule)
        if predicted_stalls(headroom, plan, frame_rate, pause, jitter, head_start) == 0:
            return size
    return sizes[-1]


MAX_NEEDED_HEADROOM = 64.0


def headroom_needed(
    plan: ChunkPlan,
    frame_rate: float = DEFAULT_FRAME_RATE,
    pause: float = 0.0,
    jitter: float = DEFAULT_START_JITTER_S,
    head_start: float = 0.0,
) -> float:
    """The smallest headroom at which `plan`'s listener is predicted never to wait (to 1%; at most
    MAX_NEEDED_HEADROOM): what a starting stream of that plan needs the others to leave it (the
    start guard, start_guard.py). More headroom never adds a stall, so a bisection finds it."""
    if predicted_stalls(MAX_NEEDED_HEADROOM, plan, frame_rate, pause, jitter, head_start):
        return MAX_NEEDED_HEADROOM
    low, high = 0.0, MAX_NEEDED_HEADROOM
    while high - low > 0.01 * high:
        mid = (low + high) / 2
        if predicted_stalls(mid, plan, frame_rate, pause, jitter, head_start):
            low = mid
        else:
            high = mid
    return high
