"""The gateway's core, shared by its REST and gRPC faces: admit, pick replicas, run, fan out.

`open()` does everything that can refuse a request (validation, admission, replica choice, the
first stage answer) before a single byte of the response is sent, so refusals become proper HTTP
statuses; `Session.events()` then streams text and audio as they come.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from gateway.admission import Admission, Permit, Rejected
from gateway.audio_capacity import (
    AUDIO_STAGES,
    DEFAULT_FRAME_RATE,
    AudioCapacity,
    code2wav_pause,
    initial_frames_for,
    measured_capacity,
    replica_speeds,
)
from gateway.config import STAGE_MESSAGE_HEADROOM, GatewayConfig
from gateway.deployment import Deployment
from gateway.media_decoder import MediaDecoder
from gateway.media_parts import pending
from gateway.metrics import GatewayMetrics
from gateway.readiness import Readiness
from gateway.replicas import Replica, Replicas
from gateway.wiring import StageStubs, run_stages
from omnistream.chunk_key import validate_request_id
from omnistream.errors import DeadlineExceeded, InvalidRequest, OmniError, TooLarge, Unavailable
from omnistream.listener import AudioArrival, Listening, listen
from omnistream.media import text_of
from omnistream.qwen3_omni.chunk_plan import ChunkPlan, dynamic_initial_frames
from omnistream.relay import Emit
from omnistream.request import AudioEvent, DoneEvent, GenerationRequest, TextEvent
from omnistream.security import channel_credentials
from omnistream.stage_chain import stages_for

log = logging.getLogger(__name__)

# The longest a fragile stream holds new audio starts (the start guard, admission.py), whatever it
# has in hand.
START_GUARD_TIMEOUT_S = 3.0
AUDIO_BUFFER = 64  # audio chunks held for a slow reader before the stages feel backpressure

Event = TextEvent | AudioEvent | DoneEvent


class _Collector:
    """Between the stages and one client: text deltas merge while the reader lags, audio never drops
    (when `AUDIO_BUFFER` chunks wait, reading from the stages pauses: backpressure, not loss)."""

    def __init__(self) -> None:
        self._items: deque[Event | BaseException] = deque()
        self._audio = 0
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    async def put(self, item: Event | BaseException) -> None:
        if isinstance(item, TextEvent) and self._items and isinstance(self._items[-1], TextEvent):
            last = self._items[-1]
            self._items[-1] = TextEvent(last.token_ids + item.token_ids, last.delta + item.delta)
        else:
            if isinstance(item, AudioEvent):
                while self._audio >= AUDIO_BUFFER:
                    self._room.clear()
                    await self._room.wait()
                self._audio += 1
            self._items.append(item)
        self._changed.set()

    async def get(self) -> Event | BaseException:
        while not self._items:
            self._changed.clear()
            await self._changed.wait()
        item = self._items.popleft()
        if isinstance(item, AudioEvent):
            self._audio -= 1
            self._room.set()
        return item


@dataclass
class Timings:
    started: float
    first_text: float | None = None
    last_text: float | None = None
    first_audio: float | None = None
    last_audio: float | None = None
    audio_seconds: float = 0.0
    # Each audio chunk as the client was handed it (the listener model, omnistream/listener.py)
    audio_chunks: list[AudioArrival] = field(default_factory=list)


class Session:
    """One admitted request. Iterate `events()`; `aclose()` (or leaving the loop) cancels the stages."""

    def __init__(
        self,
        core: GatewayCore,
        request_id: str,
        permit: Permit,
        replicas: list[Replica],
        body: Callable[[Emit], Awaitable[DoneEvent]],
        deadline: float,
        first_chunk_s: float | None = None,
        start_guard: float = 0.0,
    ) -> None:
        """`first_chunk_s`: the audio seconds of the request's first chunk, when it has audio; while
        a stream that started with less than `start_guard` seconds has less than that in hand, new
        audio starts wait (the start guard, admission.py)."""
        self.core = core
        self.request_id = request_id
        self._permit = permit
        self._replicas = replicas
        self._body = body  # runs the request, emitting into the collector: its one buffer
        self._deadline = deadline
        self._collector = _Collector()
        self._pump: asyncio.Task | None = None
        self.timings = Timings(time.perf_counter())
        self.done: DoneEvent | None = None
        self._closed = False
        self._status = "cancelled"
        self._first: Event | None = None
        self._guard = start_guard
        self._guard_timer: asyncio.TimerHandle | None = None
        if first_chunk_s is not None and first_chunk_s < self._guard and permit.audio:
            permit.mark_starting()
            # A stream that never gets ahead (no audio, or slower than real time) holds no one for long.
            self._guard_timer = asyncio.get_running_loop().call_later(START_GUARD_TIMEOUT_S, permit.settle)

    def _audio_in_hand(self, now: float) -> float:
        """Seconds of audio the listener has received but not yet played (listener model)."""
        t = self.timings
        played = now - t.first_audio - self.listening().stall_s
        return t.audio_seconds - played

    async def _run_source(self) -> None:
        try:
            async with asyncio.timeout_at(self._deadline):
                done = await self._body(self._collector.put)
            await self._collector.put(done)
        except TimeoutError:
            await self._collector.put(DeadlineExceeded("the request exceeded its timeout"))
        except BaseException as exc:  # handed to the reader, which raises it
            await self._collector.put(exc)

    def start(self) -> None:
        self._pump = asyncio.create_task(self._run_source())

    @property
    def replica_addresses(self) -> dict[str, str]:
        """The replica serving each stage of this request (the realtime API reports them)."""
        return {replica.stage: replica.address for replica in self._replicas}

    async def next_event(self) -> Event:
        item = await self._collector.get()
        if isinstance(item, BaseException):
            if isinstance(item, OmniError):
                self._note_failure(item)
            raise item
        now = time.perf_counter()
        t = self.timings
        m = self.core.metrics
        if isinstance(item, TextEvent):
            if t.first_text is None:
                t.first_text = now
                m.ttft.observe(now - t.started)
            elif t.last_text is not None:
                m.itl.observe(now - t.last_text)
            t.last_text = now
        elif isinstance(item, AudioEvent):
            if t.first_audio is None:
                t.first_audio = now
                m.ttfp.observe(now - t.started)
            t.last_audio = now
            t.audio_seconds += item.audio.size / item.sample_rate
            t.audio_chunks.append(AudioArrival(now, item.audio.size, item.sample_rate))
            guarded = self._guard_timer is not None and self._permit.starting
            if guarded and self._audio_in_hand(now) >= self._guard:
                self._permit.settle()
        elif isinstance(item, DoneEvent):
            self.done = item
            m.e2e.observe(now - t.started)
            if t.audio_seconds > 0 and t.last_audio is not None:
                m.rtf.observe((t.last_audio - t.started) / t.audio_seconds)
            heard = self.listening()
            if heard.heard:
                m.observe_listening(heard)
            self._status = "ok"
        return item

    def listening(self) -> Listening:
        """What a listener playing this request's audio as the gateway handed it out heard so far
        (all of it once the request is done): stalls, underrun, continuity."""
        return listen(self.timings.audio_chunks)

    async def prime(self) -> None:
        """Wait for the first event, so that a stage refusing the request surfaces as an error of
        `open()` (an HTTP status) rather than in the middle of a stream."""
        try:
            self._first = await self.next_event()
        except BaseException as exc:
            self._status = exc.kind if isinstance(exc, OmniError) else "cancelled"
            await self.aclose()
            raise

    async def events(self) -> AsyncIterator[Event]:
        try:
            while True:
                if self._first is not None:
                    event, self._first = self._first, None
                else:
                    event = await self.next_event()
                yield event
                if isinstance(event, DoneEvent):
                    return
        except OmniError as exc:
            self._status = exc.kind
            raise
        finally:
            await self.aclose()

    def _note_failure(self, error: OmniError) -> None:
        stage = getattr(error, "stage", None)
        if error.kind == "unavailable" and stage is not None:
            for replica in self._replicas:
                if replica.stage == stage:
                    self.core.replicas.mark_failed(replica)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._guard_timer is not None:
            self._guard_timer.cancel()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(BaseException):
                await self._pump
        for replica in self._replicas:
            replica.inflight -= 1
        self._permit.release()
        self.core.metrics.in_flight.dec()
        self.core.metrics.finished.labels(status=self._status).inc()


def check_prompt_size(request: GenerationRequest, limit: int) -> None:
    """413 for a prompt over `max_prompt_chars`, before any stage sees it: past that it could not
    run anyway, and it is what keeps every prompt inside one stage message (see GatewayConfig)."""
    if request.prompt_ids is not None:
        size, field, unit = len(request.prompt_ids), "prompt_ids", "token ids"
    else:
        size = sum(len(text_of(m["content"])) for m in request.messages or ())
        field, unit = "messages", "characters of message text"
    if size > limit:
        raise TooLarge(f"the prompt has {size} {unit}; at most {limit} are accepted", field=field)


def unsupported_media(
    request: GenerationRequest, modalities: tuple[str, ...] | None
) -> InvalidRequest | None:
    """The 422 for the first media part of a kind the deployment's thinker does not take (its Info's
    input_modalities), naming the part; call it while the parts are still encoded (they carry their
    field). None when all are taken, or when no thinker was heard from (no request runs then)."""
    if modalities is None:
        return None
    for part, item in pending(request.messages):
        if part["type"] not in modalities:
            return InvalidRequest(
                f"this deployment's model takes no {part['type']} input "
                f"(its thinker accepts: {', '.join(modalities)})",
                field=item.field,
            )
    return None


def check_message_size(request: GenerationRequest, media_bytes: int, max_message_bytes: int) -> None:
    """413 when the prompt's text and its decoded media together cannot fit the one stage message
    that carries them to the thinker (each fits alone: GatewayConfig checks the limits)."""
    if not media_bytes:
        return
    text = sum(len(text_of(m["content"]).encode("utf-8", "surrogatepass")) for m in request.messages or ())
    room = max_message_bytes - STAGE_MESSAGE_HEADROOM
    if text + media_bytes > room:
        raise TooLarge(
            f"the prompt's text ({text} bytes) and decoded media ({media_bytes} bytes) do not fit one "
            f"stage message ({room} bytes)",
            field="messages",
        )


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
            audio_gate=self._audio_gate if config.audio_hold else None,
            max_audio_hold=config.audio_hold_queue,
            on_hold=self.metrics.audio_held_total.inc,
        )
        self.metrics.queued.set_function(lambda: self.admission.waiting)
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
        self.media = MediaDecoder(config.media_limits)
        self.metrics.watch_audio(self)

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

    def audio_capacity(self) -> AudioCapacity:
        """What the talker and code2wav sustain together, as they last reported (audio_capacity.py)."""
        return AudioCapacity.of(
            (replica_speeds(self.replicas.sets[stage].replicas) for stage in AUDIO_STAGES),
            self.deployment.frames_per_second,
        )

    def _audio_gate(self, running: int) -> bool:
        return self.audio_capacity().admits(running, self.config.audio_hold_margin)

    def chunk_plan(self, request: GenerationRequest, permit: Permit | None = None) -> ChunkPlan:
        """The request's codec chunk plan. Its first chunk: the request's own, else the smallest
        the measured headroom allows for the audio streams running with it (audio_capacity.py),
        else (speed unknown) the load rule on the requests running beside it. Without `permit`: as
        if it were admitted now (what `open` checks before admission)."""
        initial = request.initial_codec_chunk_frames
        if initial is None:
            admitted = permit is not None
            streams = self.admission.audio_active + (0 if admitted and permit.audio else 1)
            headroom = self.audio_capacity().headroom(streams)
            chunk = request.codec_chunk_frames
            if headroom is None:
                others = self.admission.active - (1 if admitted else 0)
                initial = dynamic_initial_frames(others, self.config.max_concurrency, chunk)
            else:
                pause = code2wav_pause(streams, chunk, self.stage_capacity("code2wav"))
                initial = initial_frames_for(
                    headroom,
                    chunk,
                    request.codec_chunk_schedule,
                    self.deployment.frames_per_second or DEFAULT_FRAME_RATE,
                    pause,
                )
        return request.chunk_plan(initial)

    async def open(
        self, request: GenerationRequest, request_id: str | None = None, timeout: float | None = None
    ) -> Session:
        rid = validate_request_id(request_id or uuid.uuid4().hex)
        try:
            self.readiness.require(audio=request.return_audio)  # 503 naming the stage it lacks
            await self.prepare(request)
            self.chunk_plan(request)  # a bad plan is refused before admission
            # Audio may wait here for the listeners already playing (admission.py's audio hold).
            permit = await self.admission.acquire(audio=request.return_audio)
        except Rejected as exc:
            self.metrics.rejected.labels(reason=exc.reason).inc()
            raise
        except OmniError as exc:
            self.metrics.rejected.labels(reason=exc.kind).inc()
            raise
        self.metrics.in_flight.inc()
        # Chosen once admitted: a request that was held gets the first chunk of the speed it got in at.
        plan = self.chunk_plan(request, permit)
        stages = stages_for(request)
        timeout = min(timeout or self.config.request_timeout, self.config.request_timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        # A replica that is down is found when its stage does not accept the open message; nothing
        # has reached the client then, so the request moves to another replica.
        attempts = max(1, *(len(self.replicas.sets[s].replicas) for s in stages))
        for attempt in range(attempts):
            try:
                picked = [self.replicas.pick(stage) for stage in stages]
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
            body = functools.partial(run_stages, stubs, request, stage_rid, plan, timeout=timeout)
            first_chunk_s = plan.initial / (self.deployment.frames_per_second or DEFAULT_FRAME_RATE)
            audio_s = first_chunk_s if request.return_audio else None
            guard = self.config.audio_start_guard if self.config.audio_hold else 0.0
            session = Session(self, rid, permit, picked, body, deadline, audio_s, guard)
            session.start()
            try:
                await session.prime()
            except OmniError as exc:
                retry = exc.kind == "unavailable" and getattr(exc, "stage", None) and attempt + 1 < attempts
                if retry:
                    log.warning("request %s: %s; retrying on another replica", rid, exc.message)
                    permit = await self.admission.acquire_now(audio=request.return_audio)
                    self.metrics.in_flight.inc()
                    continue
                raise
            return session
        raise AssertionError("unreachable")  # pragma: no cover
