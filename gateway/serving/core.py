"""The gateway's core, shared by its REST and gRPC faces: admit, pick replicas, run, fan out.

`open()` does everything that can refuse a request (validation, admission, replica choice, the
first stage answer) before a single byte of the response is sent, so refusals become proper HTTP
statuses; `Session.events()` (gateway/serving/session.py) then streams text and audio as they come.
The audio capacity planning it asks (a request's chunk plan and start need, the audio hold's rule)
is `AudioPlanner`'s (gateway/admission/audio_planner.py); the core opens, retries and relays.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from dataclasses import dataclass
from typing import Literal

from gateway.admission.audio_planner import AudioPlanner
from gateway.admission.limits import Room, room_of
from gateway.admission.permits import Admission, Permit, Rejected
from gateway.cluster.deployment import Deployment
from gateway.cluster.readiness import Readiness
from gateway.cluster.replica import Replica
from gateway.cluster.replicas import Replicas
from gateway.config import GatewayConfig
from gateway.media.decode_pool import MediaDecoder
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.request_checks import check_message_size, check_prompt_size, unsupported_media
from gateway.serving.resume import Siblings
from gateway.serving.sent_audio import SentAudio
from gateway.serving.server_seeds import ServerSeeds
from gateway.serving.session import Session
from gateway.serving.stage_calls import StageStubs, run_stages
from gateway.serving.tracing import Incoming, RequestSpan
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.errors import InvalidRequest, MediaExpired, OmniError, Unavailable
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import media_kinds
from omnistream.request.stage_chain import stages_for
from omnistream.service.security import channel_credentials
from omnistream.wire.chunk_key import validate_request_id
from omnistream.wire.messages import Referrer

log = logging.getLogger(__name__)


# How an attempt that failed before any output goes on (`GatewayCore._retry`).
Retry = Literal["resend", "move"]


@dataclass(frozen=True)
class _Run:
    """What every attempt of an admitted request shares (`GatewayCore._admitted`)."""

    request: GenerationRequest
    rid: str
    span: RequestSpan
    plan: ChunkPlan
    stages: tuple[str, ...]
    kinds: frozenset[str]  # the media kinds the thinker picked must take
    timeout: float
    deadline: float  # the event loop's time
    held: bool  # its output waits for `Session.release` (a speculative request)


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
        # The audio capacity planning (chunk plans, start needs, the hold's rule and log line); it
        # reads admission's counts, so the hold's rule is plugged into admission once both exist.
        self.planner = AudioPlanner(self.replicas, self.deployment, self.admission, config)
        if config.audio_hold:
            self.admission.audio_gate = self.planner.admits
        self.media = MediaDecoder(config.media_limits)
        self.sent_audio = SentAudio()  # what each thinker replica holds of a scope's audio
        self.seeds = ServerSeeds(config.seed)
        planner = self.planner
        self.metrics.watch_audio(
            tuple(self.replicas.sets),
            capacity=planner.stage_capacity,
            output=planner.stage_output,
            assumed=planner.assumed_capacity,
            headroom=lambda streams: planner.audio_capacity().headroom(streams),
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
        # An empty speaker is the talker's default voice (its Info did not say which).
        voices = self.deployment.voices
        speaker = request.speaker
        if request.return_audio and voices is not None and speaker and speaker.lower() not in voices:
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

    def _room(self) -> Room:
        """What the stages' replicas in rotation hold now (admission's derived limits, limits.py)."""
        return room_of(self.replicas.sets)

    def _on_hold(self, reason: str, request_id: str | None) -> None:
        """A request starts waiting in the audio hold: counted by reason, and logged by the planner
        with the speeds the decision stood on."""
        self.metrics.audio_held_total.labels(reason=reason).inc()
        self.planner.on_hold(reason, request_id)

    async def open(
        self,
        request: GenerationRequest,
        request_id: str | None = None,
        timeout: float | None = None,
        trace: Incoming | None = None,
        held: bool = False,
        head_start: float = 0.0,
    ) -> Session:
        """The admitted, running request (`Session`), or the error that refused it. `trace`: the
        entry point's span name and the caller's trace context (gateway/serving/tracing.py): the
        request's span starts here, so a refusal ends it with its status, and the session ends it
        otherwise. `held`: a speculative request, whose output waits for `Session.release`, expected
        `head_start` seconds from now: its listener starts no sooner, so its first chunk is sized
        with what the stages make meanwhile in hand (AudioPlanner.chunk_plan)."""
        rid = request_id or uuid.uuid4().hex
        request = await self.seeds.apply(request)
        span = RequestSpan(trace, rid, request)
        try:
            return await self._open(request, validate_request_id(rid), timeout, span, held, head_start)
        except BaseException as exc:
            span.refused(exc)
            raise

    async def _open(
        self,
        request: GenerationRequest,
        rid: str,
        timeout: float | None,
        span: RequestSpan,
        held: bool,
        head_start: float = 0.0,
    ) -> Session:
        """Admit, then attempt on picked replicas until the stages take the request: an attempt
        refused before any output is retried (`_retry`) with a new permit."""
        permit = await self._admit(request, rid)
        self.metrics.in_flight.inc()
        run = self._admitted(request, rid, permit, timeout, span, held, head_start)
        # A replica that is down is found when its stage does not accept the open message; nothing
        # has reached the client then, so the request moves to another replica.
        attempts = max(1, *(len(self.replicas.sets[s].replicas) for s in run.stages))
        attempt, refer = -1, request.refer_audio
        while attempt + 1 < attempts:
            attempt += 1
            picked = self._pick(run, permit)
            thinker = picked[0].address
            referrer = self.sent_audio.referrer(request.cache_scope, thinker) if refer else None
            session = self._start_attempt(run, picked, permit, attempt, referrer)
            try:
                await session.prime()
            except OmniError as exc:
                retry = self._retry(exc, rid, referred=referrer is not None, more=attempt + 1 < attempts)
                if retry is None:
                    raise
                if retry == "resend":  # the replica lost audio it held: the same request, with its samples
                    self.sent_audio.forget(request.cache_scope, thinker)
                    refer, attempts = False, attempts + 1
                span.retried(exc, attempt + 1)
                permit = await self.admission.acquire_now(audio=request.return_audio)
                self.metrics.in_flight.inc()
                continue
            if request.refer_audio:
                self.sent_audio.confirm(request.cache_scope, thinker, request.messages)
            return session
        raise AssertionError("unreachable")  # pragma: no cover: the last attempt returns or raises

    async def _admit(self, request: GenerationRequest, rid: str) -> Permit:
        """Every check that can refuse the request, then its permit (counted by reason if refused).
        Audio requests count themselves in as arriving (`AudioPlanner.sizing_streams`) until
        admission counts them."""
        planner = self.planner
        arriving = request.return_audio
        planner.audio_arriving += arriving
        try:
            # One turn of the loop first: the other requests of a wave that arrived with this one
            # count themselves in before any of them is sized (`sizing_streams`).
            await asyncio.sleep(0)
            self.readiness.require(audio=request.return_audio)  # 503 naming the stage it lacks
            await self.prepare(request)
            planner.chunk_plan(request)  # a bad plan is refused before admission
            # From here admission counts it (playing or held), in the same turn of the loop.
            planner.audio_arriving -= arriving
            arriving = False
            # Audio may wait here for the listeners already playing (the audio hold, admission/permits.py).
            return await self.admission.acquire(audio=request.return_audio, request_id=rid)
        except Rejected as exc:
            self.metrics.rejected.labels(reason=exc.reason).inc()
            raise
        except OmniError as exc:
            self.metrics.rejected.labels(reason=exc.kind).inc()
            raise
        finally:
            planner.audio_arriving -= arriving

    def _admitted(
        self,
        request: GenerationRequest,
        rid: str,
        permit: Permit,
        timeout: float | None,
        span: RequestSpan,
        held: bool = False,
        head_start: float = 0.0,
    ) -> _Run:
        """What every attempt of the admitted request shares: its plan (and start need), stages,
        the media kinds its thinker must take, its timeout and deadline."""
        # Chosen once admitted: a request that was held gets the first chunk of the speed it got in at.
        plan = self.planner.chunk_plan(request, permit, head_start)
        if permit.audio:
            permit.need = self.planner.start_need(request, plan, permit, head_start)
        span.admitted(permit, self.deployment.model_id, plan.initial if request.return_audio else None)
        stages = stages_for(request)
        kinds = media_kinds(request.messages)  # the thinker picked must take them all
        timeout = min(timeout or self.config.request_timeout, self.config.request_timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        return _Run(request, rid, span, plan, stages, kinds, timeout, deadline, held)

    def _pick(self, run: _Run, permit: Permit) -> list[Replica]:
        """A replica of each of the request's stages, counted as serving it; with a stage that has
        none to give, the request is refused (503) and its permit released."""
        try:
            picked = [self.replicas.pick(s, run.kinds if s == "thinker" else frozenset()) for s in run.stages]
        except Unavailable:
            permit.release()
            self.metrics.in_flight.dec()
            self.metrics.rejected.labels(reason="unavailable").inc()
            raise
        for replica in picked:
            replica.inflight += 1
            replica.served += 1
        return picked

    def _start_attempt(
        self, run: _Run, picked: list[Replica], permit: Permit, attempt: int, referrer: Referrer | None
    ) -> Session:
        """The session of one attempt on `picked`, started (`prime` says whether the stages took it)."""
        stubs = StageStubs(*(r.stub for r in picked), *([None] * (3 - len(picked))))
        # A retry gets its own id at the stages: the abandoned attempt may still hold the old one.
        stage_rid = run.rid if attempt == 0 else f"{run.rid[:120]}.r{attempt}"
        calls = run.span.stage_calls({r.stage: r.address for r in picked}, stage_rid)  # None: off
        body = functools.partial(
            run_stages,
            stubs,
            run.request,
            stage_rid,
            run.plan,
            timeout=run.timeout,
            trace=calls,
            refer_audio=referrer,
            siblings=Siblings(
                self.replicas, picked, self.metrics, run.span, run.rid, self.config.max_resumes, run.kinds
            ),
        )
        first_chunk_s = run.plan.initial / self.planner.frames_per_second
        session = Session(
            metrics=self.metrics,
            mark_failed=self.replicas.mark_failed,
            request_id=run.rid,
            permit=permit,
            replicas=picked,
            body=body,
            deadline=run.deadline,
            first_chunk_s=first_chunk_s if run.request.return_audio else None,
            start_guard=self.config.audio_start_guard if self.config.audio_hold else 0.0,
            trace=run.span,
            held=run.held,
        )
        session.start()
        return session

    @staticmethod
    def _retry(exc: OmniError, rid: str, *, referred: bool, more: bool) -> Retry | None:
        """How an attempt that failed before any output goes on: "resend" (it referred to audio the
        thinker no longer holds: the same request again, with its samples), "move" (a stage's
        replica is unavailable and an attempt is left: other replicas), None (the error is the
        request's answer). `referred`: it referred to audio by digest; `more`: an attempt is left."""
        if exc.kind == MediaExpired.kind and referred:
            log.info("request %s: %s; sending its audio again", rid, exc.message)
            return "resend"
        if exc.kind == Unavailable.kind and exc.stage is not None and more:
            log.warning("request %s: %s; retrying on another replica", rid, exc.message)
            return "move"
        return None
