"""The gateway's core, shared by its REST and gRPC faces: admit, pick replicas, run, fan out.

`open()` does everything that can refuse a request (validation, admission, replica choice, the
first stage answer) before a single byte of the response is sent, so refusals become proper HTTP
statuses; `Session.events()` (gateway/serving/session.py) then streams text and audio as they come.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid

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
from gateway.admission.limits import Room, room_of
from gateway.admission.permits import Admission, Permit, Rejected
from gateway.cluster.deployment import Deployment
from gateway.cluster.readiness import Readiness
from gateway.cluster.replicas import Replicas
from gateway.config import GatewayConfig
from gateway.media.decode_pool import MediaDecoder
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.request_checks import check_message_size, check_prompt_size, unsupported_media
from gateway.serving.sent_audio import SentAudio
from gateway.serving.session import Session
from gateway.serving.stage_calls import StageStubs, run_stages
from gateway.serving.tracing import Incoming, RequestSpan
from omnistream.request.chunk_plan import ChunkPlan, dynamic_initial_frames
from omnistream.request.errors import InvalidRequest, MediaExpired, OmniError, Unavailable
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import media_kinds
from omnistream.request.stage_chain import stages_for
from omnistream.service.security import channel_credentials
from omnistream.wire.chunk_key import validate_request_id

log = logging.getLogger(__name__)


def _per_second(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.0f} frames/s"


class GatewayCore:
    def __init__(self, config: GatewayConfig) -> None:
        config.validate()
        self.config = config
        self.deployment = Deployment()  # learned from the stages' Info as their replicas join
        self.metrics = GatewayMetrics()
        self.admission = Admission(
            config.max_concurrency,
            config.max_queue,
            config.queue_timeout,
            room=self._room,
            audio_gate=self._audio_gate if config.audio_hold else None,
            max_audio_hold=config.audio_hold_queue,
            on_hold=self._on_hold,
        )
        self.metrics.queued.set_function(lambda: self.admission.waiting)
        self.metrics.watch_limits(self.admission.limits)
        self.replicas = Replicas(
            {"thinker": config.thinker, "talker": config.talker, "code2wav": config.code2wav},
            config.max_message_bytes,
            config.health_interval,
            discovery_interval=config.discovery_interval,
            credentials=channel_credentials(config.stage_tls_ca, config.stage_tls_cert, config.stage_tls_key),
            server_name=config.stage_tls_server_name,
            deployment=self.deployment,
        )
        self.replicas.on_load = self.admission.reconsider  # new speeds may let a held request in
        self.audio_arriving = 0  # audio requests inside `open` not yet at admission (`sizing_streams`)
        self.media = MediaDecoder(config.media_limits)
        self.sent_audio = SentAudio()  # what each thinker replica holds of a scope's audio
        self.metrics.watch_audio(
            tuple(self.replicas.sets),
            capacity=self.stage_capacity,
            output=self.stage_output,
            assumed=self.assumed_capacity,
            headroom=lambda streams: self.audio_capacity().headroom(streams),
            audio_streams=lambda: self.admission.audio_active,
            audio_held=lambda: self.admission.audio_held,
        )
        self.metrics.watch_replicas(
            tuple(self.replicas.sets),
            lambda stage, rotating: sum(
                r.in_rotation == rotating for r in self.replicas.sets[stage].replicas
            ),
        )

    async def start(self) -> None:
        await self.replicas.start()

    async def stop(self) -> None:
        await self.replicas.stop()
        self.media.close()

    @property
    def readiness(self) -> Readiness:
        """What kinds of request can be served now (readiness.py): text needs a thinker only."""
        return Readiness.of(lambda stage: self.replicas.sets[stage].any_in_rotation)

    @property
    def ready(self) -> bool:
        """Something can be served (at least text); `readiness` says what."""
        return self.readiness.ready

    def validate(self, request: GenerationRequest) -> None:
        c = self.config
        check_prompt_size(request, c.max_prompt_chars)
        # The talker's voices; unknown before a talker joined, and then no audio request can run.
        voices = self.deployment.voices
        if request.return_audio and voices is not None and request.speaker.lower() not in voices:
            raise InvalidRequest(
                f"unknown voice {request.speaker!r}; choose from {list(voices)}", field="voice"
            )
        if not 1 <= request.max_tokens <= c.max_tokens_limit:
            raise InvalidRequest(f"max_tokens must be in [1, {c.max_tokens_limit}]", field="max_tokens")
        if not 1 <= request.max_audio_frames <= c.max_audio_frames:
            raise InvalidRequest(
                f"max_audio_frames must be in [1, {c.max_audio_frames}]", field="max_audio_frames"
            )
        request.sampling.validate()
        request.talker_sampling.validate("talker_")
        request.validate()

    async def prepare(self, request: GenerationRequest) -> None:
        """Every check before admission, then the media decoded in place: a bad request is a 4xx
        that never takes a permit or reaches a stage. Media come last (the costliest)."""
        self.validate(request)
        # A kind the model does not take is reported after decoding, so a bad file gets its own
        # error whatever the deployment takes; when it takes the kind (the usual case) nothing is
        # wasted.
        unsupported = unsupported_media(request, self.deployment.input_modalities)
        media_bytes = await self.media.decode(request.messages, request.use_audio_in_video)
        if unsupported is not None:
            raise unsupported
        check_message_size(request, media_bytes, self.config.max_message_bytes)

    def stage_capacity(self, stage: str) -> float | None:
        """The stage's measured units per busy second over its replicas in rotation (None: unknown)."""
        return measured_capacity(self.replicas.sets[stage].replicas)

    def stage_output(self, stage: str) -> float:
        """The units the stage's replicas in rotation produced per second of wall time lately."""
        return sum(
            r.load.output_per_second
            for r in self.replicas.sets[stage].replicas
            if r.in_rotation and r.load is not None
        )

    def audio_capacity(self) -> AudioCapacity:
        """What the talker and code2wav sustain together, as they last reported (audio_capacity.py)."""
        return AudioCapacity.of(
            (replica_speeds(self.replicas.sets[stage].replicas) for stage in AUDIO_STAGES),
            self.deployment.frames_per_second,
        )

    def assumed_capacity(self, stage: str, streams: int) -> float | None:
        """The stage's units per busy second with `streams` audio streams, as its replicas' step-time
        models say (audio_capacity.py; None: unknown)."""
        return assumed_capacity(self.replicas.sets[stage].replicas, streams)

    def _code2wav_pause(self, streams: int, chunk: int) -> float:
        """How long a new stream's later windows may wait behind the others' at Code2Wav
        (audio_capacity.code2wav_pause), with the frame bound of its replicas' steps."""
        replicas = [r for r in self.replicas.sets["code2wav"].replicas if r.in_rotation]
        bounds = [r.info.limits.max_step_frames if r.info is not None else 0 for r in replicas]
        step_frames = max(bounds) if bounds and all(bounds) else None  # one unbounded: no bound
        return code2wav_pause(streams, chunk, self.assumed_capacity("code2wav", streams - 1), step_frames)

    def _room(self) -> Room:
        """What the stages' replicas in rotation hold now (admission's derived limits, limits.py)."""
        return room_of(self.replicas.sets)

    def _audio_gate(self, running: int, need: float | None) -> bool:
        return self.audio_capacity().admits(running, self.config.audio_hold_margin, need)

    def _on_hold(self, reason: str, request_id: str | None) -> None:
        """A request starts waiting in the audio hold: counted by reason, and logged with the speeds
        the decision stood on (assumed at the batch it would make, and measured at today's)."""
        self.metrics.audio_held_total.labels(reason=reason).inc()
        streams = self.admission.audio_active + 1
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
            self.admission.audio_active,
            self.admission.audio_starting,
            "unknown" if headroom is None else f"{headroom:.2f}",
            1.0 + self.config.audio_hold_margin,
            "; ".join(speeds),
        )

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
        admitted = permit is not None and permit.audio
        playing = self.admission.audio_active + (0 if admitted else 1)
        coming = self.audio_arriving + self.admission.audio_held
        if not coming:
            return playing
        most = min(playing + coming, max(playing, self.admission.limits().with_audio))
        if not self.config.audio_hold:
            return most
        capacity, margin = self.audio_capacity(), self.config.audio_hold_margin
        fits = playing
        while fits < most and capacity.admits(fits, margin):  # the hold's own rule, one at a time
            fits += 1
        return fits

    def chunk_plan(self, request: GenerationRequest, permit: Permit | None = None) -> ChunkPlan:
        """The request's codec chunk plan. Its first chunk: the request's own, else the smallest
        the measured headroom allows for the audio streams it will play beside (`sizing_streams`,
        audio_capacity.py), else (speed unknown) the load rule on the requests running beside it.
        Without `permit`: as if it were admitted now (what `open` checks before admission)."""
        initial = request.initial_codec_chunk_frames
        if initial is None:
            admitted = permit is not None
            streams = self.sizing_streams(permit)
            headroom = self.audio_capacity().headroom(streams)
            chunk = request.codec_chunk_frames
            if headroom is None:
                others = self.admission.active - (1 if admitted else 0)
                initial = dynamic_initial_frames(others, self.admission.limits().concurrency, chunk)
            else:
                fps, pause, jitter = self._start_allowances(streams, chunk)
                schedule = request.codec_chunk_schedule
                initial = initial_frames_for(headroom, chunk, schedule, fps, pause, jitter)
        return request.chunk_plan(initial)

    def start_need(self, request: GenerationRequest, plan: ChunkPlan, permit: Permit) -> float | None:
        """The headroom an admitted audio stream of `plan` needs while it starts (the start guard,
        gateway/admission/start_guard.py): the smallest at which its listener is predicted never to
        wait, with the same allowances its first chunk was sized with. None where the gateway did not size it
        (the request chose its first chunk, or the speed is unknown)."""
        if request.initial_codec_chunk_frames is not None or self.audio_capacity().headroom(1) is None:
            return None
        return headroom_needed(plan, *self._start_allowances(self.sizing_streams(permit), plan.chunk))

    def _start_allowances(self, streams: int, chunk: int) -> tuple[float, float, float]:
        """(frames per second, Code2Wav pause, start jitter) a starting stream with `streams` audio
        streams is predicted with (audio_capacity.py): its first chunk is sized with them and its
        need while it starts is computed with them."""
        c = self.config
        jitter = c.audio_start_jitter + c.audio_start_jitter_per_stream * max(streams - 1, 0)
        fps = self.deployment.frames_per_second or DEFAULT_FRAME_RATE
        return fps, self._code2wav_pause(streams, chunk), jitter

    async def open(
        self,
        request: GenerationRequest,
        request_id: str | None = None,
        timeout: float | None = None,
        trace: Incoming | None = None,
    ) -> Session:
        """The admitted, running request (`Session`), or the error that refused it. `trace`: the
        entry point's span name and the caller's trace context (gateway/serving/tracing.py): the
        request's span starts here, so a refusal ends it with its status, and the session ends it
        otherwise."""
        rid = request_id or uuid.uuid4().hex
        span = RequestSpan(trace, rid, request)
        try:
            return await self._open(request, validate_request_id(rid), timeout, span)
        except BaseException as exc:
            span.refused(exc)
            raise

    async def _open(
        self, request: GenerationRequest, rid: str, timeout: float | None, span: RequestSpan
    ) -> Session:
        arriving = request.return_audio
        self.audio_arriving += arriving
        try:
            # One turn of the loop first: the other requests of a wave that arrived with this one
            # count themselves in before any of them is sized (`sizing_streams`).
            await asyncio.sleep(0)
            self.readiness.require(audio=request.return_audio)  # 503 naming the stage it lacks
            await self.prepare(request)
            self.chunk_plan(request)  # a bad plan is refused before admission
            # From here admission counts it (playing or held), in the same turn of the loop.
            self.audio_arriving -= arriving
            arriving = False
            # Audio may wait here for the listeners already playing (the audio hold, admission/permits.py).
            permit = await self.admission.acquire(audio=request.return_audio, request_id=rid)
        except Rejected as exc:
            self.metrics.rejected.labels(reason=exc.reason).inc()
            raise
        except OmniError as exc:
            self.metrics.rejected.labels(reason=exc.kind).inc()
            raise
        finally:
            self.audio_arriving -= arriving
        self.metrics.in_flight.inc()
        # Chosen once admitted: a request that was held gets the first chunk of the speed it got in at.
        plan = self.chunk_plan(request, permit)
        if permit.audio:
            permit.need = self.start_need(request, plan, permit)
        span.admitted(permit, self.deployment.model_id, plan.initial if request.return_audio else None)
        stages = stages_for(request)
        kinds = media_kinds(request.messages)  # the thinker picked must take them all
        timeout = min(timeout or self.config.request_timeout, self.config.request_timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        # A replica that is down is found when its stage does not accept the open message; nothing
        # has reached the client then, so the request moves to another replica.
        attempts = max(1, *(len(self.replicas.sets[s].replicas) for s in stages))
        attempt, refer = -1, request.refer_audio
        while attempt + 1 < attempts:
            attempt += 1
            try:
                picked = [self.replicas.pick(s, kinds if s == "thinker" else frozenset()) for s in stages]
            except Unavailable:
                permit.release()
                self.metrics.in_flight.dec()
                self.metrics.rejected.labels(reason="unavailable").inc()
                raise
            for replica in picked:
                replica.inflight += 1
                replica.served += 1
            stubs = StageStubs(*(r.stub for r in picked), *([None] * (3 - len(picked))))
            # A retry gets its own id at the stages: the abandoned attempt may still hold the old one.
            stage_rid = rid if attempt == 0 else f"{rid[:120]}.r{attempt}"
            calls = span.stage_calls({r.stage: r.address for r in picked}, stage_rid)  # None: off
            thinker = picked[0].address
            referrer = self.sent_audio.referrer(request.cache_scope, thinker) if refer else None
            body = functools.partial(
                run_stages,
                stubs,
                request,
                stage_rid,
                plan,
                timeout=timeout,
                trace=calls,
                refer_audio=referrer,
            )
            first_chunk_s = plan.initial / (self.deployment.frames_per_second or DEFAULT_FRAME_RATE)
            audio_s = first_chunk_s if request.return_audio else None
            guard = self.config.audio_start_guard if self.config.audio_hold else 0.0
            session = Session(
                self.metrics,
                self.replicas.mark_failed,
                rid,
                permit,
                picked,
                body,
                deadline,
                audio_s,
                guard,
                span,
            )
            session.start()
            try:
                await session.prime()
            except OmniError as exc:
                expired = exc.kind == MediaExpired.kind and referrer is not None
                retry = exc.kind == "unavailable" and getattr(exc, "stage", None) and attempt + 1 < attempts
                if expired:  # the replica lost audio it held: the same request again, with its samples
                    self.sent_audio.forget(request.cache_scope, thinker)
                    refer, attempts = False, attempts + 1
                    log.info("request %s: %s; sending its audio again", rid, exc.message)
                elif retry:
                    log.warning("request %s: %s; retrying on another replica", rid, exc.message)
                else:
                    raise
                span.retried(exc, attempt + 1)
                permit = await self.admission.acquire_now(audio=request.return_audio)
                self.metrics.in_flight.inc()
                continue
            if request.refer_audio:
                self.sent_audio.confirm(request.cache_scope, thinker, request.messages)
            return session
        raise AssertionError("unreachable")  # pragma: no cover: the last attempt returns or raises
