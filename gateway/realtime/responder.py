"""The connection's responses, one at a time: each starts with the history fitted to the thinker's
context (gateway/realtime/context.py: the oldest items go only when the turn would not fit
otherwise), is sent once more when the thinker still refuses its prompt as too long (`_refit`), and
at its end shares the thinker's count of its prompt out over the items it was made of. A response
started right after a user audio turn was committed answers it, and takes when its speech ended
(its voice-to-voice is measured, gateway/realtime/voice_to_voice.py).

Its own owner because a response's turn (its settings, what its prompt was made of) lives from its
start to its end and only these steps read it. The connection hands over the session's config and
conversation, and is told of items dropped from the history and of each response's end.
"""

from __future__ import annotations

import logging
import time
import typing
from collections.abc import Awaitable, Callable

from gateway.realtime import events as ev
from gateway.realtime.client_items import InputItem, ItemReference
from gateway.realtime.client_items import Item as GivenItem
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
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.events import EventError
from gateway.realtime.outbound import Outbound
from gateway.realtime.protocol import Protocol, new_id
from gateway.realtime.response import ResponseRun
from gateway.realtime.session_config import SessionConfig
from gateway.realtime.settings import ResponseFields
from gateway.realtime.speculation import CHANGED, Parts, Speculation
from gateway.realtime.turn import ResponseSettings, answer_item, build_request
from gateway.realtime.vad import INPUT_RATE
from gateway.serving.core import GatewayCore
from gateway.serving.session import Session
from gateway.serving.tracing import realtime_entry
from omnistream.request.defaults import ServingDefaults
from omnistream.request.errors import InvalidRequest, OmniError, error_class
from omnistream.request.generation import GenerationRequest

log = logging.getLogger(__name__)


class TellDropped(typing.Protocol):
    """How the connection tells of items dropped from the history (`Connection._dropped`): to the
    client, the logs and the metrics; `why` ends its log line."""

    def __call__(self, dropped: list[tuple[str, str]], why: str = "") -> Awaitable[None]: ...


class MakeItem(typing.Protocol):
    """How the connection makes an item a client gave (`Connection._made_item`): its media decoded,
    a function call's result checked against `conversation`'s calls."""

    def __call__(
        self, given: GivenItem, item_id: str, conversation: Conversation, event_id: str | None
    ) -> Awaitable[Item]: ...


class Responder:
    def __init__(
        self,
        core: GatewayCore,
        protocol: Protocol,
        outbound: Outbound,
        config: SessionConfig,
        conversation: Conversation,
        session_id: str,
        cache_scope: bytes,
        *,
        dropped: TellDropped,
        on_end: Callable[[], None],
        make_item: MakeItem,
    ) -> None:
        self.core = core
        self.protocol = protocol
        self.outbound = outbound
        self.config = config
        self.conversation = conversation
        self.session_id = session_id  # for the logs
        self.cache_scope = cache_scope
        self._dropped = dropped
        self._on_end = on_end  # a response ended: the idle timeout counts from here
        self._make_item = make_item
        self.response: ResponseRun | None = None
        # The running response's turn: its settings and what its prompt was made of (the
        # thinker's count of it is shared out over its items when it ends).
        self.turn: tuple[ResponseSettings, ServingDefaults] | None = None
        self.shape: PromptShape | None = None
        self.speculation: Speculation | None = None  # the response prepared during a silence

    @property
    def busy(self) -> bool:
        return self.response is not None and self.response.active

    def context_tokens(self) -> int:
        """Tokens a turn (prompt and answer) may take: the thinker's max_model_len (the smallest of
        those in rotation), capped by realtime_context_tokens; the serve default if none says."""
        reported = self.core.deployment.max_model_len
        cap = self.core.config.realtime_context_tokens
        if reported is None:
            return cap or DEFAULT_CONTEXT_TOKENS
        return min(reported, cap) if cap else reported

    async def create(self, event: ev.ResponseCreate) -> None:
        if self.busy:
            raise EventError(
                "a response is in progress; cancel it or wait for response.done",
                code="conversation_already_has_active_response",
            )
        fields = event.response
        context = None
        if fields is not None and fields.input is not None:
            context = await self._input(fields.input, event.event_id)
        await self.start(fields, context)

    async def _input(self, given: list[InputItem], event_id: str | None) -> Conversation:
        """A response's own `input` as a conversation of its own, which the response is made from
        instead of the session's: the items it names (the session's, as they are) and the items it
        gives (made here, in no conversation of the session's)."""
        context = Conversation()
        for i, entry in enumerate(given):
            if isinstance(entry, ItemReference):
                item = self.conversation.items.get(entry.id)
                if item is None:
                    raise EventError(
                        f"no item {entry.id!r} in the conversation",
                        code="item_not_found",
                        param=f"response.input.{i}.id",
                    )
            else:
                item = await self._make_item(entry, entry.id or new_id("item"), context, event_id)
            context.add(item)
        return context

    def _copy(self) -> Conversation:
        """The session's conversation as it is now, for a response that must leave it untouched."""
        copy = Conversation()
        copy.items.update(self.conversation.items)
        return copy

    async def start(self, fields: ResponseFields | None, context: Conversation | None = None) -> None:
        """Start a response (response.create's `fields`, or None: a detected turn's, the session's).
        It is made from `context` (a response's own `input`), or else from the conversation; with
        `conversation: "none"` (out-of-band) its items join no conversation of the session's: the
        conversation stays as it was, and no conversation.item.* event tells of them. A speculative
        response whose request is the very one this response makes is taken (`_held_for`)."""
        out_of_band = fields is not None and fields.conversation == "none"
        if context is None:
            context = self._copy() if out_of_band else self.conversation
        sink = context if out_of_band else self.conversation  # where the answer's items go
        answered = self._spoken_turn() if context is self.conversation else None
        if not any(i.role == "user" for i in context.items.values()):
            raise EventError("the conversation has no user item to respond to", code="conversation_empty")
        settings, serving = self._settings(fields)
        tool_use = settings.tool_use  # a choice that does not fit the tools: refused before it starts
        assert settings.max_output_tokens is not None
        item = answer_item(settings)
        previous = sink.last_id()
        # The answer's item first (the history's caps count it), then the prompt fitted to the context.
        await self._dropped(sink.add(item))
        try:
            await self._fit(settings.instructions, settings.max_output_tokens, conversation=context)
            request = build_request(context, self.config, settings, serving, self.cache_scope)
        except ContextFull as exc:
            sink.remove(item)
            raise EventError(exc.message, code=CONTEXT_EXCEEDED) from None
        except OmniError as exc:
            sink.remove(item)
            raise EventError.of(exc) from None
        self.turn = (settings, serving)
        # The thinker's count of the prompt is shared out over the session's items (context.py):
        # only when the prompt was the session's conversation.
        self.shape = shape_of(context, settings.instructions) if context is self.conversation else None
        self.response = ResponseRun(
            self.core,
            self.protocol,
            self.outbound,
            request,
            item,
            previous,
            self._ended,
            self._refit,
            tools=tool_use,
            conversation=sink,
            on_dropped=self._dropped,
            output_format=settings.output_format,
            in_conversation=not out_of_band,
            metadata=fields.metadata if fields is not None else None,
            spoken=answered.spoken if answered is not None else None,
            held=await self._held_for(request),
        )
        if answered is not None:
            answered.spoken = None  # taken: a second response to the turn measures nothing
        self.response.start()

    def _settings(self, fields: ResponseFields | None) -> tuple[ResponseSettings, ServingDefaults]:
        """A response's settings (the session's with `fields`), its answer capped to the limit."""
        settings = ResponseSettings.of(self.config, fields, self.core.deployment.voices)
        limit = self.core.config.max_tokens_limit
        if settings.max_output_tokens is None or settings.max_output_tokens > limit:
            settings.max_output_tokens = min(
                settings.max_output_tokens or self.core.config.default_max_tokens, limit
            )
        deployment = self.core.deployment
        serving = ServingDefaults.of(self.core.config, deployment.voices, deployment.default_voice)
        return settings, serving

    # -- speculation (gateway/realtime/speculation.py) -----------------------------------------
    def speculate(self, end: int, pcm: bytes, decode: Callable[[], Awaitable[Parts]]) -> None:
        """Start, held, the response a turn committed from `pcm` (the buffer up to stream sample
        `end`, decoded by `decode`) would start; at most one at a time."""
        if self.speculation is not None:
            return
        seconds = len(pcm) / 2 / INPUT_RATE
        # The decision comes a lead after the pause: nothing plays before it, so the first chunk
        # is sized for a listener who starts then (GatewayCore.open's head_start).
        decision = time.monotonic() + self.core.config.realtime_speculation_lead_ms / 1000

        def open_held(request: GenerationRequest) -> Awaitable[Session]:
            head_start = max(0.0, decision - time.monotonic())
            return self.core.open(
                request, trace=realtime_entry("speculative"), held=True, head_start=head_start
            )

        self.speculation = Speculation(
            end,
            pcm,
            self.core.metrics,
            decode,
            lambda parts: self._speculative_request(parts, seconds),
            open_held,
        )

    async def _speculative_request(self, parts: Parts, seconds: float) -> GenerationRequest | None:
        """The request `start(None)` will build once the turn of `parts` is committed, built now on
        a copy of the conversation with the turn in it (None: that start would refuse it)."""
        context = Conversation(self.conversation.limits)
        context.items.update(self.conversation.items)
        context.system_tokens = self.conversation.system_tokens
        turn = Item(new_id("item"), "user", parts, [{"type": "input_audio", "transcript": None}])
        turn.audio_seconds = seconds
        context.add(turn)
        settings, serving = self._settings(None)
        settings.tool_use  # noqa: B018  # what the response refuses, so does this (an EventError)
        assert settings.max_output_tokens is not None
        context.add(answer_item(settings))
        try:
            await self._fit(settings.instructions, settings.max_output_tokens, conversation=context)
        except ContextFull:
            return None
        return build_request(context, self.config, settings, serving, self.cache_scope)

    async def speculation_for(self, end: int, pcm: bytes) -> Speculation | None:
        """The speculation made of exactly the committed `pcm` (up to `end`); any other is
        cancelled: the turn it prepared is not the one committed."""
        speculation = self.speculation
        if speculation is None or speculation.holds(end, pcm):
            return speculation
        await self.drop_speculation(CHANGED)
        return None

    async def drop_speculation(self, outcome: str) -> None:
        """Cancel the speculation (if any) in every stage, counted as `outcome`."""
        speculation, self.speculation = self.speculation, None
        if speculation is not None:
            await speculation.cancel(outcome)

    async def _held_for(self, request: GenerationRequest) -> Speculation | None:
        """The speculation whose request is `request` (the response takes it); any other is
        cancelled."""
        speculation, self.speculation = self.speculation, None
        if speculation is None:
            return None
        if await speculation.matches(request):
            return speculation
        await speculation.cancel(CHANGED)
        return None

    def _spoken_turn(self) -> Item | None:
        """The user audio turn a response now answers: the conversation's newest item, when it is a
        committed turn no response has taken yet (not after a tool's result or another item)."""
        last = self.conversation.last_id()
        item = self.conversation.items.get(last) if last is not None else None
        return item if item is not None and item.spoken is not None else None

    async def cancel(self, event: ev.ResponseCancel) -> None:
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

    async def _fit(
        self,
        instructions: str | None,
        reserve: int,
        context: int | None = None,
        conversation: Conversation | None = None,
    ) -> None:
        """Drop the oldest items the next turn (its prompt and `reserve` tokens of answer) needs
        gone to fit the context; ContextFull (nothing dropped) when it cannot fit. `conversation`:
        a response's own (its `input`, or an out-of-band copy), whose drops tell the client nothing."""
        context = context or self.context_tokens()
        conversation = conversation or self.conversation
        tokens = prompt_tokens(conversation, instructions)
        drops: list[Drop] = fit(conversation, instructions, context, reserve)
        for drop in drops:
            conversation.remove(drop.item)
        if conversation is not self.conversation:
            return
        why = (
            f" before a turn of ~{tokens} prompt tokens + max_output_tokens {reserve} "
            f"(context {context} tokens)"
        )
        await self._dropped([(d.item.id, d.reason) for d in drops], why)

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
            raise error_class(CONTEXT_EXCEEDED, InvalidRequest)(exc.message) from None  # a 400, as OpenAI's
        if len(self.conversation.items) == before:
            return None
        log.info(
            "realtime session %s: the thinker refused the prompt as too long; sent again", self.session_id
        )
        self.shape = shape_of(self.conversation, settings.instructions)
        return build_request(self.conversation, self.config, settings, serving, self.cache_scope)

    async def _ended(self, response: ResponseRun) -> None:
        self._on_end()
        done, item = response.done, response.item
        item.generated_tokens = len(done.output_ids) if done is not None else response.output_tokens
        if done is not None and self.shape is not None:  # the thinker's count of the whole prompt
            measure(self.conversation, self.shape, len(done.prompt_ids))
        self.turn = self.shape = None
