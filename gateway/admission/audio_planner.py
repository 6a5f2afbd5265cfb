"""The gateway's audio capacity planning: what the audio stages sustain now, each request's chunk
plan, the headroom a starting stream needs, and the audio hold's rule and log line.

`AudioPlanner` reads the replicas' reported speeds (gateway/cluster/replicas.py), the deployment's
frame rate, admission's counts (gateway/admission/permits.py) and the gateway's settings; the math
itself is audio_capacity.py's. `GatewayCore.open` (gateway/serving/core.py) asks it for a request's
plan and start need; admission asks it whether one more audio stream may start (`admits`) and tells
it of a request that starts waiting in the hold (`on_hold`); the metrics read its speeds
(`stage_capacity`, `stage_output`, `assumed_capacity`, `audio_capacity`).
"""

from __future__ import annotations

import logging

from gateway.admission.audio_capacity import (
    AUDIO_STAGES,
    DEFAULT_FRAME_RATE,
    AudioCapacity,
    assumed_capacity,
    code2wav_pause,
    headroom_needed,
    initial_frames_for,
    measured_capacity,
    replica_speeds,
)
from gateway.admission.permits import Admission, Permit
from gateway.cluster.deployment import Deployment
from gateway.cluster.replicas import Replicas
from gateway.config import GatewayConfig
from omnistream.request.chunk_plan import ChunkPlan, dynamic_initial_frames
from omnistream.request.generation import GenerationRequest

log = logging.getLogger(__name__)


def _per_second(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0f} frames/s"


class AudioPlanner:
    """Audio capacity planning over the gateway's replicas, deployment, admission and settings."""

    def __init__(
        self, replicas: Replicas, deployment: Deployment, admission: Admission, config: GatewayConfig
    ) -> None:
        self._replicas = replicas
        self._deployment = deployment
        self._admission = admission
        self._config = config
        # Audio requests inside `GatewayCore.open` not yet at admission (`sizing_streams`): the core
        # counts them in as they arrive and out as they reach admission or leave.
        self.audio_arriving = 0

    # The speeds the metrics read (gateway/serving/metrics.py `watch_audio`).

    def stage_capacity(self, stage: str) -> float | None:
        """The stage's measured units per busy second over its replicas in rotation (None: unknown)."""
        return measured_capacity(self._replicas.sets[stage].replicas)

    def stage_output(self, stage: str) -> float:
        """The units the stage's replicas in rotation produced per second of wall time lately."""
        return sum(
            r.load.output_per_second
            for r in self._replicas.sets[stage].replicas
            if r.in_rotation and r.load is not None
        )

    def audio_capacity(self) -> AudioCapacity:
        """What the talker and code2wav sustain together, as they last reported (audio_capacity.py)."""
        return AudioCapacity.of(
            (replica_speeds(self._replicas.sets[stage].replicas) for stage in AUDIO_STAGES),
            self._deployment.frames_per_second,
        )

    def assumed_capacity(self, stage: str, streams: int) -> float | None:
        """The stage's units per busy second with `streams` audio streams, as its replicas' step-time
        models say (audio_capacity.py; None: unknown)."""
        return assumed_capacity(self._replicas.sets[stage].replicas, streams)

    @property
    def frames_per_second(self) -> float:
        """The codec's frames per second: the deployment's, else Qwen3-Omni's."""
        return self._deployment.frames_per_second or DEFAULT_FRAME_RATE

    # The audio hold (admission's `audio_gate` and `on_hold`, gateway/admission/permits.py).

    def admits(self, running: int, need: float | None) -> bool:
        """The audio gate: may one more stream start beside `running`, meeting the fragile ones' `need`?"""
        return self.audio_capacity().admits(running, self._config.audio_hold_margin, need)

    def on_hold(self, reason: str, request_id: str | None) -> None:
        """A request starts waiting in the audio hold: logged with the speeds the decision stood on
        (assumed at the batch it would make, and measured at today's)."""
        admission = self._admission
        streams = admission.audio_active + 1
        headroom = self.audio_capacity().headroom(streams)
        speeds = []
        for stage in AUDIO_STAGES:
            assumed, measured = self.assumed_capacity(stage, streams), self.stage_capacity(stage)
            speeds.append(f"{stage} assumed {_per_second(assumed)}, measured {_per_second(measured)}")
        log.warning(
            "request %s held for audio (%s): %d streams playing, %d starting, headroom with one more %s "
            "(needs %.2f); %s",
            request_id or "?",
            reason,
            admission.audio_active,
            admission.audio_starting,
            "unknown" if headroom is None else f"{headroom:.2f}",
            1.0 + self._config.audio_hold_margin,
            "; ".join(speeds),
        )

    # A request's plan.

    def sizing_streams(self, permit: Permit | None = None) -> int:
        """The audio streams a new stream's first chunk is sized with (and its start need computed
        with): those playing, itself among them, plus the audio requests on their way in (inside
        `open` before admission, or held), as many of them as could play at once (the most streams
        the hold admits, or without it admission's limit of requests with audio). A wave of
        simultaneous requests starts together: sized only with the streams already playing, its
        first streams looked alone, got 2-frame first chunks that the rest of the wave would make
        run dry, and so (the start guard) held the rest of the wave until they had a second of audio
        in hand (docs/benchmarks.md, issue 33 run 8: TTFT 0.69 s at 16 against 0.16 s without the
        hold). Without `permit`: as if admitted now."""
        admission = self._admission
        admitted = permit is not None and permit.audio
        playing = admission.audio_active + (0 if admitted else 1)
        coming = self.audio_arriving + admission.audio_held
        if not coming:
            return playing
        most = min(playing + coming, max(playing, admission.limits().with_audio))
        if not self._config.audio_hold:
            return most
        capacity, margin = self.audio_capacity(), self._config.audio_hold_margin
        fits = playing
        while fits < most and capacity.admits(fits, margin):  # the hold's own rule, one at a time
            fits += 1
        return fits

    def chunk_plan(
        self, request: GenerationRequest, permit: Permit | None = None, head_start: float = 0.0
    ) -> ChunkPlan:
        """The request's codec chunk plan. Its first chunk: the request's own, else the smallest
        the measured headroom allows for the audio streams it will play beside (`sizing_streams`,
        audio_capacity.py), else (speed unknown) the load rule on the requests running beside it.
        Without `permit`: as if it were admitted now (what `open` checks before admission).
        `head_start`: seconds before its listener can start (a held speculation's release)."""
        initial = request.initial_codec_chunk_frames
        if initial is None:
            admitted = permit is not None
            streams = self.sizing_streams(permit)
            headroom = self.audio_capacity().headroom(streams)
            chunk = request.codec_chunk_frames
            if headroom is None:
                others = self._admission.active - (1 if admitted else 0)
                initial = dynamic_initial_frames(others, self._admission.limits().concurrency, chunk)
            else:
                fps, pause, jitter = self._start_allowances(streams, chunk)
                schedule = request.codec_chunk_schedule
                initial = initial_frames_for(headroom, chunk, schedule, fps, pause, jitter, head_start)
        return request.chunk_plan(initial)

    def start_need(
        self, request: GenerationRequest, plan: ChunkPlan, permit: Permit, head_start: float = 0.0
    ) -> float | None:
        """The headroom an admitted audio stream of `plan` needs while it starts (the start guard,
        gateway/admission/start_guard.py): the smallest at which its listener is predicted never to
        wait, with the same allowances its first chunk was sized with. None where the gateway did not
        size it (the request chose its first chunk, or the speed is unknown)."""
        if request.initial_codec_chunk_frames is not None or self.audio_capacity().headroom(1) is None:
            return None
        allowances = self._start_allowances(self.sizing_streams(permit), plan.chunk)
        return headroom_needed(plan, *allowances, head_start)

    def _start_allowances(self, streams: int, chunk: int) -> tuple[float, float, float]:
        """(frames per second, Code2Wav pause, start jitter) a starting stream with `streams` audio
        streams is predicted with (audio_capacity.py): its first chunk is sized with them and its
        need while it starts is computed with them."""
        c = self._config
        jitter = c.audio_start_jitter + c.audio_start_jitter_per_stream * max(streams - 1, 0)
        return self.frames_per_second, self._code2wav_pause(streams, chunk), jitter

    def _code2wav_pause(self, streams: int, chunk: int) -> float:
        """How long a new stream's later windows may wait behind the others' at Code2Wav
        (audio_capacity.code2wav_pause), with the frame bound of its replicas' steps."""
        replicas = [r for r in self._replicas.sets["code2wav"].replicas if r.in_rotation]
        bounds = [r.info.limits.max_step_frames if r.info is not None else 0 for r in replicas]
        step_frames = max(bounds) if bounds and all(bounds) else None  # one unbounded: no bound
        return code2wav_pause(streams, chunk, self.assumed_capacity("code2wav", streams - 1), step_frames)
