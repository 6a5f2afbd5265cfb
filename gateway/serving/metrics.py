"""Gateway metrics: client-side latencies as `vllm bench serve` defines them, plus admission."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, GCCollector, Histogram, ProcessCollector

from gateway.admission.audio_capacity import AUDIO_STAGES
from gateway.admission.limits import Limits
from omnistream.audio.listener import Listening

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0)
ITL_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
# 0.1 is the listener's continuity threshold: the le="0.1" bucket counts the requests that kept
# continuity, _count all those with audio.
UNDERRUN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# From a client's commit (~0.1 s) to a server VAD's silence window and more (0.5-1.5 s, then work).
VOICE_TO_VOICE_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        # The process's RSS, CPU and GC, as every stage exports them (the default registry's), so
        # one alert and one panel cover all four processes.
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        self._latency_metrics(r)
        self._listening_metrics(r)
        self._admission_metrics(r)
        self._audio_capacity_metrics(r)
        self._realtime_metrics(r)
        self._resume_metrics(r)

    def _latency_metrics(self, r: CollectorRegistry) -> None:
        """Client-side latencies, as `vllm bench serve` defines them."""
        self.ttft = Histogram(
            "omnistream_time_to_first_token_seconds",
            "Time to the first text delta",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttfp = Histogram(
            "omnistream_time_to_first_audio_seconds",
            "Time to the first audio chunk",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "omnistream_inter_token_latency_seconds",
            "Gap between text deltas",
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "omnistream_e2e_latency_seconds",
            "Request start to its last chunk",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rtf = Histogram(
            "omnistream_real_time_factor",
            "Time to the last audio chunk / audio seconds",
            buckets=RTF_BUCKETS,
            registry=r,
        )

    def _listening_metrics(self, r: CollectorRegistry) -> None:
        """The listener model (omnistream/audio/listener.py) over each completed request's audio, as sent."""
        self.underrun = Histogram(
            "omnistream_audio_underrun_seconds",
            "Per request with audio: its underrun, the time a real-time player started at the first "
            "chunk waits for audio (vLLM-Omni's audio_underrun); <= 0.1 s keeps continuity",
            buckets=UNDERRUN_BUCKETS,
            registry=r,
        )
        self.stalled = Counter(
            "omnistream_audio_stalled_requests_total",
            "Requests whose player ran out of audio at least once before the last chunk",
            registry=r,
        )
        self.stall_seconds = Counter(
            "omnistream_audio_stall_seconds_total",
            "Seconds players waited with an empty buffer, over all requests",
            registry=r,
        )

    def _admission_metrics(self, r: CollectorRegistry) -> None:
        """Admission: requests in flight, queued, refused and ended, and its limits."""
        self.in_flight = Gauge("omnistream_requests_in_flight", "Admitted requests not yet ended", registry=r)
        self.queued = Gauge("omnistream_requests_queued", "Requests waiting for admission", registry=r)
        self.limit = Gauge(
            "omnistream_admission_limit",
            "Admission's limits now, as the stages report their room or the operator capped them "
            "(concurrency: admitted at once; audio: of those, with audio; queue: waiting for a slot; "
            "audio_hold: waiting in the audio hold)",
            ["kind"],
            registry=r,
        )
        self.rejected = Counter(
            "omnistream_requests_rejected_total", "Requests refused, by reason", ["reason"], registry=r
        )
        self.finished = Counter(
            "omnistream_requests_finished_total", "Requests ended, by status", ["status"], registry=r
        )

    def _audio_capacity_metrics(self, r: CollectorRegistry) -> None:
        """Audio admission by measured speed (gateway/admission/audio_capacity.py), and the replicas
        in rotation; read when scraped."""
        self.stage_capacity = Gauge(
            "omnistream_stage_capacity_per_second",
            "Units a stage sustains per second of engine busy time, as its replicas in rotation measure "
            "it (thinker: tokens, talker and code2wav: codec frames); 0: unknown",
            ["stage"],
            registry=r,
        )
        self.stage_output = Gauge(
            "omnistream_stage_output_per_second",
            "Units a stage produced per second of wall time lately, summed over its replicas",
            ["stage"],
            registry=r,
        )
        self.audio_streams = Gauge(
            "omnistream_audio_streams", "Admitted requests with audio (streams playing)", registry=r
        )
        self.audio_headroom = Gauge(
            "omnistream_audio_headroom_ratio",
            "Measured audio capacity / (audio streams x frames per second of audio), with one more "
            "stream counted; 0: unknown",
            registry=r,
        )
        self.audio_held = Gauge(
            "omnistream_requests_audio_waiting", "Audio requests waiting for audio capacity now", registry=r
        )
        self.audio_held_total = Counter(
            "omnistream_requests_audio_held_total",
            "Audio requests that had to wait in the audio hold, by reason (capacity: the assumed "
            "capacity was short; start_guard: a starting stream was fragile; queue: others waited; "
            "room: the audio stages held all the requests they take)",
            ["reason"],
            registry=r,
        )
        self.replicas = Gauge(
            "omnistream_stage_replicas",
            "Replicas of a stage the gateway knows, by state (in_rotation: healthy and serving; "
            "out_of_rotation: failed a call or a health check, draining, or not ready yet)",
            ["stage", "state"],
            registry=r,
        )
        self.assumed_capacity = Gauge(
            "omnistream_audio_assumed_capacity_per_second",
            "Codec frames per busy second an audio stage would sustain with one more audio stream, "
            "as its step-time model says (what the audio hold admits by); 0: unknown",
            ["stage"],
            registry=r,
        )

    def _resume_metrics(self, r: CollectorRegistry) -> None:
        """Requests moved to a sibling replica after a loss (gateway/serving/resume.py)."""
        self.resumes = Counter(
            "omnistream_gateway_resumes",
            "A stage replica lost under a running request, by stage and outcome: resumed (a sibling "
            "continues or regenerates it), no_sibling or limit (the request ends with the loss's error)",
            ["stage", "outcome"],
            registry=r,
        )
        self.resume_gap = Histogram(
            "omnistream_gateway_resume_gap_seconds",
            "From a resumed request's loss to its next output sent to the client (audio; text for a "
            "thinker), by the stage lost",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def _realtime_metrics(self, r: CollectorRegistry) -> None:
        """What a person talking over /v1/realtime feels (gateway/realtime/voice_to_voice.py)."""
        self.voice_to_voice = Histogram(
            "omnistream_realtime_voice_to_voice_seconds",
            "Per realtime response to a user audio turn: the end of the user's speech, as the turn "
            "detector located it, to the answer's first audio delta sent, by what decided the turn "
            "(server_vad, semantic_vad; none: the client committed)",
            ["turn_detection"],
            buckets=VOICE_TO_VOICE_BUCKETS,
            registry=r,
        )
        # gateway/realtime/speculation.py: answers prepared during the silence before a decision.
        self.speculations = Counter(
            "omnistream_realtime_speculations",
            "Speculative realtime responses by how they ended: released (the decided turn's "
            "response took it), resumed (the user spoke again), changed (the session changed before "
            "the decision), unused (no response followed), failed (its open failed)",
            ["outcome"],
            registry=r,
        )
        self.speculation_wasted = Counter(
            "omnistream_realtime_speculation_wasted_seconds",
            "Seconds the speculative responses that were not released ran in the stages",
            registry=r,
        )
        # gateway/realtime/work_ahead.py: a turn's audio encoded while it is spoken.
        self.work_ahead = Counter(
            "omnistream_realtime_work_ahead",
            "Realtime turns' audio sent to the thinker while spoken, its whole encoder windows encoded "
            "ahead of the commit, by outcome (done; cancelled: by the commit; failed: refused or "
            "lost, the commit encodes all)",
            ["outcome"],
            registry=r,
        )

    def watch_limits(self, limits: Callable[[], Limits]) -> None:
        """Point the limit gauge at admission's limits (read at each scrape)."""
        readings: dict[str, Callable[[Limits], int]] = {
            "concurrency": lambda now: now.concurrency,
            "audio": lambda now: now.with_audio,
            "queue": lambda now: now.queue,
            "audio_hold": lambda now: now.audio_hold,
        }
        for kind, read in readings.items():
            self.limit.labels(kind=kind).set_function(partial(_read_limit, read, limits))

    def watch_replicas(self, stages: Iterable[str], count: Callable[[str, bool], int]) -> None:
        """`count(stage, in_rotation)`: the replicas of a stage the gateway knows that are in
        rotation (healthy, serving) or not; read at each scrape."""
        for stage in stages:
            for state, rotating in (("in_rotation", True), ("out_of_rotation", False)):
                self.replicas.labels(stage=stage, state=state).set_function(partial(count, stage, rotating))

    def watch_audio(
        self,
        stages: Iterable[str],
        *,
        capacity: Callable[[str], float | None],
        output: Callable[[str], float],
        assumed: Callable[[str, int], float | None],
        headroom: Callable[[int], float | None],
        audio_streams: Callable[[], int],
        audio_held: Callable[[], int],
    ) -> None:
        """Point the speed and audio-hold gauges at these readings (evaluated at each scrape).

        `capacity(stage)`, `output(stage)`: a stage's measured units per busy second and per wall
        second; `assumed(stage, streams)` its step-time model's capacity with that many audio
        streams; `headroom(streams)` the audio headroom with that many; `audio_streams()` the audio
        streams admitted, `audio_held()` those waiting. Passed in rather than read off the core, so
        the metrics know nothing of it (the core owns them)."""
        stages = tuple(stages)
        for stage in stages:
            self.stage_capacity.labels(stage=stage).set_function(partial(_or_zero, capacity, stage))
            self.stage_output.labels(stage=stage).set_function(partial(output, stage))
        for stage in AUDIO_STAGES:
            if stage in stages:
                self.assumed_capacity.labels(stage=stage).set_function(
                    partial(_assumed_with_one_more, assumed, stage, audio_streams)
                )
        self.audio_streams.set_function(audio_streams)
        self.audio_headroom.set_function(lambda: headroom(audio_streams() + 1) or 0.0)
        self.audio_held.set_function(audio_held)

    def observe_listening(self, heard: Listening) -> None:
        """One completed request's listener result."""
        self.underrun.observe(heard.underrun_s)
        self.stall_seconds.inc(heard.stall_s)
        if heard.stalls:
            self.stalled.inc()


def _read_limit(read: Callable[[Limits], int], limits: Callable[[], Limits]) -> int:
    return read(limits())


def _or_zero(reading: Callable[[str], float | None], stage: str) -> float:
    return reading(stage) or 0.0


def _assumed_with_one_more(
    assumed: Callable[[str, int], float | None], stage: str, audio_streams: Callable[[], int]
) -> float:
    return assumed(stage, audio_streams() + 1) or 0.0
