"""One realtime connection: client events in, server events out (through `Outbound`).

Every client event is handled in order on the connection's receive loop; a bad one gets an `error`
event naming it (`error.event_id`) and changes nothing, so the session stays usable. Media are
decoded when their item is made (a committed turn, an item with audio or an image), in the
gateway's decoder threads, so a response never waits on a decode and a bad file is refused once.
Before each response the history is fitted to the thinker's context (gateway/realtime/context.py):
the oldest items go only when the turn would not fit otherwise.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from gateway.config import GatewayConfig
from gateway.realtime import events as ev
from gateway.realtime.audio import decode_base64_pcm, encoded_turn, settled
from gateway.realtime.context import (
    CONTEXT_EXCEEDED,
    DEFAULT_CONTEXT_TOKENS,
    ContextFull,
    Drop,
    PromptShape,
    fit,
    measure,
    overflow_of,
    prompt_tokens,
    shape_of,
)
from gateway.realtime.events import EventError
from gateway.realtime.function_calls import function_item
from gateway.realtime.items import check_modality, item_parts
from gateway.realtime.outbound import Outbound
from gateway.realtime.protocol import Protocol, new_id
from gateway.realtime.response import ResponseRun
from gateway.realtime.session import (
    AppendRate,
    Conversation,
    HistoryLimits,
    InputBuffer,
    Item,
    SessionConfig,
)
from gateway.realtime.turn import ResponseSettings, build_request
from gateway.realtime.vad import INPUT_RATE, SpeechDetector
from gateway.serving.core import GatewayCore
from omnistream.request.defaults import ServingDefaults
from omnistream.request.errors import OmniError, from_kind
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import AudioInput

log = logging.getLogger(__name__)

MIN_COMMIT_MS = 100  # OpenAI refuses to commit less


def _ms(samples: int) -> int:
    return samples * 1000 // INPUT_RATE


class Connection:
    def __init__(
        self,
        core: GatewayCore,
        outbound: Outbound,
        beta: bool,
        model: str | None,
        on_barge_in: Callable[[], None] = lambda: None,
        on_drop: Callable[[str, int], None] = lambda reason, count: None,
    ) -> None:
        c: GatewayConfig = core.config
        self.core = core
        self.outbound = outbound
        self.protocol = Protocol(beta)
        self.id = new_id("sess")
        self.model = model or core.deployment.model_id or ""
        self.config = SessionConfig()
        self.buffer = InputBuffer(int(c.realtime_max_buffer_seconds * INPUT_RATE) * 2)
        self.rate = AppendRate(c.realtime_append_burst_seconds)
        self.conversation = Conversation(HistoryLimits.of(c))
        self.detector = self._detector()
        self.response: ResponseRun | None = None
        self.turn_item_id: str | None = None  # the user item a detected turn will become
        self.last_activity = time.monotonic()
        self._handling = False  # a client event is being handled
        self.on_barge_in = on_barge_in
        self.on_drop = on_drop  # (reason, items): items dropped from the history
        # The session's prefix cache scope (omnistream/engine/prefix_cache.py): a secret no client
        # sees, so only this session's turns find what its turns cached; released at its close.
        self.cache_scope = secrets.token_bytes(16)
        # The running response's turn: its settings and what its prompt was made of (the
        # thinker's count of it is shared out over its items when it ends).
        self.turn: tuple[ResponseSettings, ServingDefaults] | None = None
        self.shape: PromptShape | None = None

    def _detector(self) -> SpeechDetector | None:
        td = self.config.turn_detection
        return None if td is None else SpeechDetector(td.threshold, td.silence_duration_ms)

    @property
    def busy(self) -> bool:
        return self.response is not None and self.response.active

    @property
    def idle(self) -> bool:
        """No response runs and no client event is being handled (e.g. its media decoded)."""
        return not (self._handling or self.busy)

    async def send(self, kind: str, **fields: Any) -> None:
        await self.outbound.put(self.protocol.event(kind, **fields))

    async def error(self, exc: EventError) -> None:
        await self.outbound.put(
            self.protocol.error(exc.message, exc.code, exc.param, exc.event_id, exc.error_type)
        )

    def _voice(self) -> str | None:
        return (
            self.config.voice
            or ServingDefaults.of(self.core.config, self.core.deployment.voices).default_voice()
        )

    async def open(self) -> None:
        await self.send(
            "session.created", session=self.config.describe(self.protocol, self.id, self.model, self._voice())
        )

    # -- dispatch ------------------------------------------------------------------------------
    async def handle_text(self, text: str) -> None:
        self.last_activity = time.monotonic()
        self._handling = True
        event = None
        try:
            event = ev.parse(text)
            await self._dispatch(event)
        except EventError as exc:
            await self.error(exc)
        except OmniError as exc:  # what an event brought was refused further down (e.g. its media)
            event_id = getattr(event, "event_id", None)
            await self.error(EventError(exc.message, code=exc.kind, param=exc.field, event_id=event_id))
        except Exception as exc:  # a bug: this event fails with an error event, the session lives on
            log.exception("realtime session %s: handling an event failed", self.id)
            await self.error(
                EventError(
                    f"internal error ({type(exc).__name__})",
                    code="server_error",
                    event_id=getattr(event, "event_id", None),
                    error_type="server_error",
                )
            )
        finally:
            self._handling = False
            self.last_activity = time.monotonic()  # idle counts from the end of the client's last event

    async def handle_binary(self) -> None:
        self.last_activity = time.monotonic()
        await self.error(
            EventError("binary frames are not supported: send JSON events as text", code="invalid_frame")
        )

    async def _dispatch(self, event: ev.ClientEvent) -> None:
        eid = event.event_id
        try:
            match event:
                case ev.SessionUpdate():
                    await self._session_update(event)
                case ev.BufferAppend():
                    await self._append(event)
                case ev.BufferCommit():
                    await self._commit(None, eid)
                case ev.BufferClear():
                    self.buffer.clear()
                    if self.detector is not None:
                        self.detector.reset()
                    self.turn_item_id = None
                    await self.send("input_audio_buffer.cleared")
                case ev.ItemCreate():
                    await self._item_create(event)
                case ev.ItemTruncate():
                    await self._truncate(event)
                case ev.ItemDelete():
                    self.conversation.delete(event.item_id)
                    await self.send("conversation.item.deleted", item_id=event.item_id)
                case ev.ResponseCreate():
                    await self._response_create(event)
                case ev.ResponseCancel():
                    await self._response_cancel(event)
        except EventError as exc:
            exc.event_id = exc.event_id or eid
            raise

    # -- session -------------------------------------------------------------------------------
    async def _session_update(self, event: ev.SessionUpdate) -> None:
        update = event.session
        voices = self.core.deployment.voices
        voice = update.voice or (update.audio.output.voice if update.audio and update.audio.output else None)
        if voice is not None and voices is not None and voice.lower() not in voices:
            raise EventError(
                f"unknown voice {voice!r}; choose from {list(voices)}",
                code="invalid_value",
                param="session.audio.output.voice",
            )
        before = self.config.turn_detection
        self.config.apply(update)
        if self.config.turn_detection != before:
            self.detector = self._detector()
            if self.detector is not None:  # its positions are stream samples, as the buffer's
                self.detector.position = self.buffer.end
            self.turn_item_id = None
        await self.send(
            "session.updated", session=self.config.describe(self.protocol, self.id, self.model, self._voice())
        )

    # -- input audio ---------------------------------------------------------------------------
    async def _append(self, event: ev.BufferAppend) -> None:
        pcm = decode_base64_pcm(event.audio, "audio", self.buffer.max_bytes, event.event_id)
        seconds = len(pcm) / 2 / INPUT_RATE
        if not self.rate.take(seconds):
            raise EventError(
                "audio is arriving faster than real time (more than "
                f"{self.rate.burst:g} s ahead): this append was dropped",
                code="input_audio_buffer_rate_exceeded",
                error_type="rate_limit_error",
            )
        if not self.buffer.append(pcm):
            if self.detector is None or not self.detector.in_speech:
                raise self._buffer_full()
            # A turn as long as the buffer (continuous speech, or a noise the VAD takes for it)
            # ends here: a server-VAD client never commits or clears, so refusing would wedge it.
            self.detector.reset()
            await self._speech_stopped(self.buffer.end)
            if not self.buffer.append(pcm):
                raise self._buffer_full()
        if self.detector is None:
            return
        for found in self.detector.process(pcm):
            if found.kind == "started":
                await self._speech_started(found.sample)
            else:
                await self._speech_stopped(found.sample)
        if not self.detector.in_speech and self.config.turn_detection is not None:
            prefix = self.config.turn_detection.prefix_padding_ms * INPUT_RATE // 1000
            self.buffer.keep_from(self.buffer.end - prefix)

    def _buffer_full(self) -> EventError:
        return EventError(
            f"the input audio buffer is full ({self.core.config.realtime_max_buffer_seconds:g} s): "
            "commit or clear it",
            code="input_audio_buffer_full",
        )

    async def _speech_started(self, sample: int) -> None:
        td = self.config.turn_detection
        assert td is not None
        self.turn_item_id = new_id("item")
        self.buffer.keep_from(sample - td.prefix_padding_ms * INPUT_RATE // 1000)
        response = self.response
        # Stopped before speech_started is queued: none of its audio can follow that event.
        barge_in = td.interrupt_response and response is not None and response.stop("turn_detected")
        await self.send(
            "input_audio_buffer.speech_started", audio_start_ms=_ms(sample), item_id=self.turn_item_id
        )
        if barge_in:
            assert response is not None
            self.on_barge_in()
            await response.wait()

    async def _speech_stopped(self, sample: int) -> None:
        td = self.config.turn_detection
        assert td is not None
        item_id = self.turn_item_id or new_id("item")
        await self.send("input_audio_buffer.speech_stopped", audio_end_ms=_ms(sample), item_id=item_id)
        try:
            committed = await self._commit(sample, None, item_id)
        except EventError as exc:
            if exc.code != "input_audio_buffer_commit_empty":
                raise
            return  # a blip too short to be a turn: dropped, not the client's error
        if committed and td.create_response and not self.busy:
            await self._start_response(None)

    async def _commit(self, until: int | None, event_id: str | None, item_id: str | None = None) -> bool:
        pcm = self.buffer.take(until)
        if self.detector is not None and until is None:
            self.detector.reset()
        self.turn_item_id = None
        if len(pcm) // 2 < MIN_COMMIT_MS * INPUT_RATE // 1000:
            raise EventError(
                f"the input audio buffer holds {_ms(len(pcm) // 2)} ms; "
                f"at least {MIN_COMMIT_MS} ms are needed",
                code="input_audio_buffer_commit_empty",
                event_id=event_id,
            )
        check_modality(self.core.deployment.input_modalities, "audio", "input_audio_buffer")
        item_id = item_id or new_id("item")
        parts: list[dict[str, Any]] = [{"type": "audio", "audio": encoded_turn(pcm, "input_audio_buffer")}]
        await self._decode(parts, event_id)
        item = Item(
            item_id,
            "user",
            parts,
            [{"type": "input_audio", "transcript": None}],
            audio_seconds=len(pcm) / 2 / INPUT_RATE,
        )
        previous = self.conversation.last_id()
        await self.send("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id)
        await self._add_item(item, previous)
        return True

    # -- conversation --------------------------------------------------------------------------
    async def _decode(self, parts: list[dict[str, Any]], event_id: str | None) -> None:
        """Decode the item's media in the gateway's decoder threads; its audio ends settled
        (gateway/realtime/audio.py), so its features stay those of its first turn."""
        try:
            await self.core.media.decode([{"role": "user", "content": parts}], False)
        except OmniError as exc:
            raise EventError(exc.message, code=exc.kind, param=exc.field, event_id=event_id) from None
        for part in parts:
            if part["type"] == "audio" and isinstance(part["audio"], AudioInput):
                part["audio"] = settled(part["audio"])

    async def _add_item(self, item: Item, previous: str | None = None) -> None:
        previous = previous or self.conversation.last_id()
        dropped = self.conversation.add(item)
        wire = item.wire(self.protocol)
        await self.send("conversation.item.added", previous_item_id=previous, item=wire)
        await self.send("conversation.item.done", previous_item_id=previous, item=wire)
        await self._dropped(dropped)

    async def _dropped(self, dropped: list[tuple[str, str]], why: str = "") -> None:
        """Tell the client (conversation.item.deleted), the logs and the metrics of items dropped
        from the history, oldest first: for good, as a deleted item."""
        if not dropped:
            return
        reasons: dict[str, int] = {}
        for _, reason in dropped:
            reasons[reason] = reasons.get(reason, 0) + 1
        log.info(
            "realtime session %s: dropped the %d oldest conversation items (%s)%s; %d kept",
            self.id,
            len(dropped),
            ", ".join(f"{reason}: {count}" for reason, count in reasons.items()),
            why,
            len(self.conversation.items),
        )
        for reason, count in reasons.items():
            self.on_drop(reason, count)
        for item_id, _ in dropped:
            await self.send("conversation.item.deleted", item_id=item_id)

    # -- the context ---------------------------------------------------------------------------
    def context_tokens(self) -> int:
        """Tokens a turn (prompt and answer) may take: the thinker's max_model_len (the smallest of
        those in rotation), capped by realtime_context_tokens; the serve default if none says."""
        reported = self.core.deployment.max_model_len
        cap = self.core.config.realtime_context_tokens
        if reported is None:
            return cap or DEFAULT_CONTEXT_TOKENS
        return min(reported, cap) if cap else reported

    async def _fit(self, instructions: str | None, reserve: int, context: int | None = None) -> None:
        """Drop the oldest items the next turn (its prompt and `reserve` tokens of answer) needs
        gone to fit the context; ContextFull (nothing dropped) when it cannot fit."""
        context = context or self.context_tokens()
        tokens = prompt_tokens(self.conversation, instructions)
        drops: list[Drop] = fit(self.conversation, instructions, context, reserve)
        for drop in drops:
            self.conversation.remove(drop.item)
        why = (
            f" before a turn of ~{tokens} prompt tokens + max_output_tokens {reserve} "
            f"(context {context} tokens)"
        )
        await self._dropped([(d.item.id, d.reason) for d in drops], why)

    async def _item_create(self, event: ev.ItemCreate) -> None:
        given = event.item
        item_id = given.id or new_id("item")
        if item_id in self.conversation.items:
            raise EventError(f"an item with id {item_id!r} exists", code="duplicate_item_id", param="item.id")
        if given.type != "message":  # a function call or its result
            await self._add_item(function_item(given.model_copy(update={"id": item_id}), self.conversation))
            return
        modalities = self.core.deployment.input_modalities
        parts, content, text, seconds = item_parts(given, modalities, self.buffer.max_bytes, event.event_id)
        await self._decode(parts, event.event_id)
        item = Item(item_id, given.role or "user", parts, content, audio_seconds=seconds)
        if given.role == "assistant":
            item.text = text
        await self._add_item(item)

    async def _truncate(self, event: ev.ItemTruncate) -> None:
        item = self.conversation.get(event.item_id)
        if item.role != "assistant" or not any(p["type"] == "output_audio" for p in item.content):
            raise EventError(
                "only an assistant item with audio can be truncated", code="invalid_value", param="item_id"
            )
        if event.content_index != 0:
            raise EventError(
                "the item has one content part (index 0)", code="invalid_value", param="content_index"
            )
        sent_ms = _ms(item.audio_samples_sent)
        if event.audio_end_ms > sent_ms:
            raise EventError(
                f"audio_end_ms {event.audio_end_ms} is past the {sent_ms} ms of audio sent",
                code="invalid_value",
                param="audio_end_ms",
            )
        if self.response is not None and self.response.active and self.response.item is item:
            await self.response.cancel("client_cancelled")
        item.truncate(event.audio_end_ms)
        await self.send(
            "conversation.item.truncated", item_id=item.id, content_index=0, audio_end_ms=event.audio_end_ms
        )

    # -- responses -----------------------------------------------------------------------------
    async def _response_create(self, event: ev.ResponseCreate) -> None:
        if self.busy:
            raise EventError(
                "a response is in progress; cancel it or wait for response.done",
                code="conversation_already_has_active_response",
            )
        if event.response is not None and event.response.conversation == "none":
            raise EventError(
                "out-of-band responses (conversation: none) are not supported",
                code="unsupported",
                param="response.conversation",
            )
        await self._start_response(event.response)

    async def _start_response(self, fields: ev.ResponseFields | None) -> None:
        if not any(i.role == "user" for i in self.conversation.items.values()):
            raise EventError("the conversation has no user item to respond to", code="conversation_empty")
        settings = ResponseSettings.of(self.config, fields)
        limit = self.core.config.max_tokens_limit
        if settings.max_output_tokens is None or settings.max_output_tokens > limit:
            settings.max_output_tokens = min(
                settings.max_output_tokens or self.core.config.default_max_tokens, limit
            )
        serving = ServingDefaults.of(self.core.config, self.core.deployment.voices)
        assert settings.max_output_tokens is not None
        kind = "output_audio" if settings.speaks else "output_text"
        item = Item(new_id("item"), "assistant", [], [{"type": kind}], status="in_progress")
        previous = self.conversation.last_id()
        # The answer's item first (the history's caps count it), then the prompt fitted to the context.
        await self._dropped(self.conversation.add(item))
        try:
            await self._fit(settings.instructions, settings.max_output_tokens)
            request = build_request(self.conversation, self.config, settings, serving, self.cache_scope)
        except ContextFull as exc:
            self.conversation.remove(item)
            raise EventError(exc.message, code=CONTEXT_EXCEEDED) from None
        except OmniError as exc:
            self.conversation.remove(item)
            raise EventError(exc.message, code=exc.kind, param=exc.field) from None
        self.turn = (settings, serving)
        self.shape = shape_of(self.conversation, settings.instructions)
        self.response = ResponseRun(
            self.core,
            self.protocol,
            self.outbound,
            request,
            item,
            previous,
            self._ended,
            self._refit,
            tools=settings.tool_use,
            conversation=self.conversation,
            on_dropped=self._dropped,
        )
        self.response.start()

    async def _refit(self, error: OmniError) -> GenerationRequest | None:
        """The thinker refused the turn's prompt as too long for its context (an estimate was
        low): its count of the prompt is a measurement; drop the oldest items that now must go and
        return the turn's request again, once. None: not that refusal, or nothing to drop (the
        refusal stands); an error of kind context_length_exceeded when the turn cannot fit."""
        found = overflow_of(error)
        if found is None or self.turn is None or self.shape is None:
            return None
        settings, serving = self.turn
        counted, length = found
        if counted is not None and not measure(self.conversation, self.shape, counted):
            # The counts kept contradict the thinker's: estimate its items again, then share it out.
            for item, _ in self.shape.items:
                item.tokens = None
            self.conversation.system_tokens = None
            measure(self.conversation, self.shape, counted)
        context = self.context_tokens() if length is None else min(length, self.context_tokens())
        assert settings.max_output_tokens is not None
        before = len(self.conversation.items)
        try:
            await self._fit(settings.instructions, settings.max_output_tokens, context)
        except ContextFull as exc:
            raise from_kind(CONTEXT_EXCEEDED, exc.message) from None
        if len(self.conversation.items) == before:
            return None
        log.info("realtime session %s: the thinker refused the prompt as too long; sent again", self.id)
        self.shape = shape_of(self.conversation, settings.instructions)
        return build_request(self.conversation, self.config, settings, serving, self.cache_scope)

    async def _ended(self, response: ResponseRun) -> None:
        self.last_activity = time.monotonic()  # the idle timeout counts from the end of a response
        done, item = response.done, response.item
        item.generated_tokens = len(done.output_ids) if done is not None else response.output_tokens
        if done is not None and self.shape is not None:  # the thinker's count of the whole prompt
            measure(self.conversation, self.shape, len(done.prompt_ids))
        self.turn = self.shape = None

    async def _response_cancel(self, event: ev.ResponseCancel) -> None:
        response = self.response
        if response is None or not response.active:
            raise EventError("no response is in progress", code="response_cancel_not_active")
        if event.response_id is not None and event.response_id != response.id:
            raise EventError(
                f"response {event.response_id!r} is not in progress",
                code="invalid_value",
                param="response_id",
            )
        await response.cancel("client_cancelled")

    async def close(self) -> None:
        """The client went away (or the session ends): cancel what runs, so every stage is freed,
        and release the session's cache scope in the stages that cached its prefixes."""
        if self.response is not None:
            await self.response.cancel("client_cancelled")
        self.core.replicas.release_cache_soon(self.cache_scope)
        self.core.sent_audio.release(self.cache_scope)
