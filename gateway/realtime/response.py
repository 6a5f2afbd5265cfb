"""One response: its request through `GatewayCore.open` (admission, replicas, the three stages),
its deltas to the client, its end (completed, incomplete, failed or cancelled) as response.done.

Cancelling (barge-in, response.cancel, a client that went away) cancels the task: leaving the core
session's event loop closes it, which cancels all three stage streams at once
(gateway/serving/stage_calls.py), and the deltas still queued for the socket are dropped first, so
the client stops getting audio at once. The assistant item then keeps what was sent (its audio end
and the same share of text).

A thinker that refuses the prompt as too long for its context (before anything reached the client)
gets it once more after `refit` dropped the oldest items (gateway/realtime/context.py).

With tools, the text goes through the tool-call parser: the message item opens at the answer's
first word (or audio), so an answer that is only calls has no message item; the calls are output
items of their own (gateway/realtime/function_calls.py). An answer whose grammar allows calls alone
(`required`, a named function) never has one, even when it ends before its first call is whole:
a call cut short is its output (incomplete), and one cut before its name leaves the output empty,
`response.done`'s `status_details` saying why.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.realtime import response_body
from gateway.realtime.audio import OutputAudio
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.formats import PCM16, AudioFormat
from gateway.realtime.function_calls import CallOutputs, Dropped
from gateway.realtime.outbound import Outbound
from gateway.realtime.protocol import Protocol, new_id
from gateway.realtime.speculation import UNUSED, Speculation
from gateway.realtime.vad import INPUT_RATE
from gateway.realtime.voice_to_voice import SpokenTurn, first_audio
from gateway.serving.core import GatewayCore
from gateway.serving.session import Session
from gateway.serving.tracing import realtime_entry
from gateway.tools.parser import CallPiece, Piece, TextPiece, ToolCallParser
from gateway.tools.spec import ToolUse
from omnistream.request.errors import InternalError, OmniError
from omnistream.request.generation import AudioEvent, DoneEvent, GenerationRequest, TextEvent

CONVERSATION_EVENTS = "conversation.item."  # what an out-of-band response does not send
log = logging.getLogger(__name__)


class ResponseRun:
    def __init__(
        self,
        core: GatewayCore,
        protocol: Protocol,
        outbound: Outbound,
        request: GenerationRequest,
        item: Item,
        previous_item_id: str | None,
        on_end: Callable[[ResponseRun], Awaitable[None]],
        refit: Callable[[OmniError], Awaitable[GenerationRequest | None]] | None = None,
        tools: ToolUse | None = None,
        conversation: Conversation | None = None,
        on_dropped: Dropped | None = None,
        output_format: AudioFormat = PCM16,
        in_conversation: bool = True,
        metadata: dict[str, str] | None = None,
        spoken: SpokenTurn | None = None,
        held: Speculation | None = None,
    ) -> None:
        """`tools`: the answer's tool use; when it parses calls, `conversation` (where the calls'
        items go, and the answer's own item, in it since the response began) is needed.
        `in_conversation` False: an out-of-band response, whose items join none of the session's
        conversations, so no conversation.item.* event tells of them. `metadata`: echoed. `spoken`:
        the user audio turn it answers, whose voice-to-voice its first audio delta measures.
        `held`: the speculation that ran its request during the silence before the turn was
        decided (gateway/realtime/speculation.py): its session is taken instead of opening one."""
        self.core = core
        self.protocol = protocol
        self.outbound = outbound
        self.request = request
        self.item = item
        self.previous_item_id = previous_item_id
        self.on_end = on_end
        self.refit = refit  # a refused request -> the request to send instead (None: the refusal stands)
        self.id = new_id("resp")
        self.speaks = request.return_audio
        self.output_format = output_format
        self.in_conversation = in_conversation
        self.metadata = metadata
        self.spoken = spoken
        self.held = held
        self.voice_to_voice_s: float | None = None  # measured at the first audio delta
        self.status = "in_progress"
        self.reason: str | None = None
        self.error: OmniError | None = None
        self.done: DoneEvent | None = None
        self.output_tokens = 0
        # How many of the answer's tokens had come when its first text did: 1, unless its first
        # tokens were bytes of a character not yet whole (held back until it is, or is known
        # broken) or the thinker's first chunk carried several (its loop was late to send the first).
        self.tokens_at_first_text: int | None = None
        self.session: Session | None = None
        self.replicas: dict[str, str] = {}
        self.last_audio_sent: float | None = None
        self.began = 0.0  # when `_run` began (time.perf_counter(): the sessions' clock)
        self.task: asyncio.Task[None] | None = None
        self._finishing = False
        self._running = False  # `_run` has begun (a task cancelled before that never runs its try)
        self._stop_asked = False  # stopped before `_run` began: it cancels itself once it begins
        self.conversation = conversation
        self.parser: ToolCallParser | None = None
        self.calls: CallOutputs | None = None
        self.calls_only = tools is not None and tools.enforced_calls  # no words: no message item
        if tools is not None and tools.parse_calls:
            assert conversation is not None, "a response that parses calls adds them to the conversation"
            self.parser = ToolCallParser(tools.names, enforced=tools.enforced_calls)
            self.calls = CallOutputs(
                protocol, self._emit, self.id, conversation, self._next_index, self._previous_id, on_dropped
            )
        self.message_open = False  # the answer's own item was announced
        self.message_index = 0  # its output_index
        self._outputs = 0  # output items announced

    # -- called by the sender when this response's audio really leaves
    def sent(self, samples: int) -> None:
        self.item.audio_samples_sent += samples
        self.last_audio_sent = time.perf_counter()

    def start(self) -> None:
        self.task = asyncio.create_task(self._run())

    @property
    def active(self) -> bool:
        return self.task is not None and not self.task.done()

    def stop(self, reason: str) -> bool:
        """Begin cancelling, without awaiting anything: the deltas not sent yet are dropped and the
        task is cancelled, so no new delta can follow whatever the caller sends next. False when it
        had already ended (or is ending on its own)."""
        if self.task is None or self.task.done() or self._finishing:
            return False
        self.reason = reason
        self.outbound.purge(self)
        if self._running:
            self.task.cancel()
        else:  # cancelling now would skip `_run` entirely: no response.done, the item left open
            self._stop_asked = True
        return True

    async def wait(self) -> None:
        """Until it has ended: its stages closed, its response.done queued."""
        if self.task is not None:
            await asyncio.wait({self.task})  # never raises the task's end; the caller's cancel passes

    async def cancel(self, reason: str) -> bool:
        stopped = self.stop(reason)
        await self.wait()
        return stopped

    async def _emit(self, kind: str, owner: bool = False, samples: int = 0, **fields: Any) -> None:
        if not self.in_conversation and kind.startswith(CONVERSATION_EVENTS):
            return
        await self.outbound.put(self.protocol.event(kind, **fields), self if owner else None, samples)

    def _where(self) -> dict[str, Any]:
        return {
            "response_id": self.id,
            "item_id": self.item.id,
            "output_index": self.message_index,
            "content_index": 0,
        }

    def _next_index(self) -> int:
        self._outputs += 1
        return self._outputs - 1

    def _previous_id(self) -> str | None:
        """The last conversation item the client knows (the answer's own is hidden until it opens)."""
        assert self.conversation is not None
        for item_id in reversed(self.conversation.items):
            if self.message_open or item_id != self.item.id:
                return item_id
        return None

    async def _run(self) -> None:
        self._running = True
        self.began = time.perf_counter()
        status = "completed"
        try:
            await self._begin()
            if self._stop_asked:
                raise asyncio.CancelledError
            await self._stream()
        except asyncio.CancelledError:
            status = "cancelled"
        except OmniError as exc:
            status, self.error = "failed", exc
        except Exception as exc:  # a bug: the response fails, the session and the stages do not
            log.exception("realtime response %s failed", self.id)
            status, self.error = "failed", InternalError(f"internal error ({type(exc).__name__})")
        else:
            if self.done is not None and self.done.finish_reason == "length":
                status, self.reason = "incomplete", "max_output_tokens"
        if status == "cancelled":
            self.outbound.purge(self)
        self._finishing = True  # from here the response ends as decided: a cancel waits for it
        try:
            if self.held is not None:  # stopped before it took the speculation's session
                await self.held.cancel(UNUSED)
            await self._finish(status)
        finally:
            await self.on_end(self)

    async def _begin(self) -> None:
        await self._emit("response.created", response=self.describe())
        if self.parser is None:
            await self._open_message()

    async def _open_message(self) -> None:
        """Announce the answer's own item (at once, or with tools at its first word)."""
        self.message_open = True
        self.message_index = self._next_index()
        await self._emit(
            "conversation.item.added",
            previous_item_id=self.previous_item_id,
            item=self.item.wire(self.protocol),
        )
        await self._emit(
            "response.output_item.added",
            response_id=self.id,
            output_index=self.message_index,
            item=self.item.wire(self.protocol),
        )
        part = self.item.wire(self.protocol)["content"][0]
        await self._emit("response.content_part.added", part=part, **self._where())

    async def _open(self) -> Session:
        try:
            if self.held is not None:
                held, self.held = self.held, None
                asked = self.spoken.decided_perf() if self.spoken is not None else self.began
                return await held.session(min(asked, self.began), self.id)  # timed from the decision
            return await self.core.open(self.request, trace=realtime_entry(self.id))
        except OmniError as exc:
            request = await self.refit(exc) if self.refit is not None else None
            if request is None:
                raise
            self.request = request
            return await self.core.open(request, trace=realtime_entry(self.id))

    async def _stream(self) -> None:
        self.session = session = await self._open()
        # Closed here, not left to the generator: a cancel that lands while a delta waits for room
        # in the send queue is raised outside `events()`, which would only close on collection.
        try:
            await self._deltas(session)
        finally:
            await session.aclose()

    async def _deltas(self, session: Session) -> None:
        self.replicas = session.replica_addresses
        converter = OutputAudio(self.output_format)
        text_kind = "response.output_audio_transcript.delta" if self.speaks else "response.output_text.delta"
        async with contextlib.aclosing(session.events()) as events:
            async for event in events:
                if isinstance(event, TextEvent):
                    self.output_tokens += len(event.token_ids)
                    if self.parser is not None:
                        for piece in self.parser.feed(event.delta):
                            await self._piece(piece, text_kind)
                    elif event.delta:
                        self.item.text += event.delta
                        await self._text(text_kind, event.delta)
                elif isinstance(event, AudioEvent):
                    await self._audio(converter.convert(event.audio, event.sample_rate))
                elif isinstance(event, DoneEvent):
                    self.done = event
        await self._audio(converter.flush())
        if self.parser is not None:
            for piece in self.parser.finish():
                await self._piece(piece, text_kind)

    async def _audio(self, data: bytes) -> None:
        """A delta of the answer's audio, in the output format; counted in samples of the session's
        24 kHz stream (`samples`), so `audio_end_ms` is the same whatever the wire's rate."""
        if not data:
            return
        if not self.message_open:  # audio is of words: their item is open by now
            await self._open_message()
        samples = self.output_format.samples(len(data))
        self.item.audio_samples_made += samples
        await self._emit(
            "response.output_audio.delta",
            owner=True,
            samples=samples,
            delta=base64.b64encode(data).decode(),
            **self._where(),
        )
        if self.spoken is not None and self.voice_to_voice_s is None:  # handed to the socket's writer
            span = self.session.trace if self.session is not None else None
            self.voice_to_voice_s = first_audio(self.spoken, self.core.metrics, span)

    async def _piece(self, piece: Piece, text_kind: str) -> None:
        """One piece of a parsed answer: words for the answer's item, or a call's piece."""
        if isinstance(piece, CallPiece):
            assert self.calls is not None
            await self.calls.take(piece)
        elif isinstance(piece, TextPiece) and piece.text:
            if not self.message_open:
                await self._open_message()
            self.item.text += piece.text
            await self._text(text_kind, piece.text)

    async def _text(self, text_kind: str, delta: str) -> None:
        if self.tokens_at_first_text is None:
            self.tokens_at_first_text = self.output_tokens
        await self._emit(text_kind, owner=True, delta=delta, **self._where())

    async def _finish(self, status: str) -> None:
        self.status = status
        if self.calls is not None:
            await self.calls.finish()
        if not self.message_open:
            if self.calls is not None and (self.calls.calls or self.calls_only or status == "cancelled"):
                self._leave_out_message()
            else:
                await self._open_message()  # an answer with nothing in it still has its (empty) item
        if self.message_open:
            await self._close_message(status)
        else:
            await self._send_error()
        await self._emit("response.done", response=self.describe())

    def _leave_out_message(self) -> None:
        """An answer of calls alone (a cut one too, or one that could only be calls) or cut before a
        word has no item of its own: it leaves, unseen, the conversation it joined when the
        response began."""
        if self.conversation is not None and self.conversation.items.get(self.item.id) is self.item:
            self.conversation.remove(self.item)

    async def _send_error(self) -> None:
        if self.error is not None:
            await self.outbound.put(
                self.protocol.error(
                    self.error.message,
                    self.error.kind,
                    self.error.field,
                    None,
                    "server_error" if self.error.kind == "internal" else "invalid_request_error",
                )
            )

    async def _close_message(self, status: str) -> None:
        item = self.item
        if status == "cancelled" and self.speaks and item.audio_samples_made:
            item.truncate(item.audio_samples_sent * 1000 // INPUT_RATE)
            await self._emit(
                "conversation.item.truncated",
                item_id=item.id,
                content_index=0,
                audio_end_ms=item.audio_end_ms,
            )
        item.status = "completed" if status == "completed" else "incomplete"
        await self._send_error()
        if self.speaks:
            await self._emit("response.output_audio.done", **self._where())
            await self._emit("response.output_audio_transcript.done", transcript=item.text, **self._where())
        else:
            await self._emit("response.output_text.done", text=item.text, **self._where())
        wire = item.wire(self.protocol)
        await self._emit("response.content_part.done", part=wire["content"][0], **self._where())
        await self._emit(
            "response.output_item.done", response_id=self.id, output_index=self.message_index, item=wire
        )
        await self._emit("conversation.item.done", previous_item_id=self.previous_item_id, item=wire)

    def outputs(self) -> list[Item]:
        """The response's output items in output order: its own (once announced) and its calls."""
        found = [(self.message_index, self.item)] if self.message_open else []
        if self.calls is not None:
            found += self.calls.outputs
        return [item for _, item in sorted(found, key=lambda pair: pair[0])]

    def usage(self) -> dict[str, Any]:
        """The tokens of the prompt and of the answer (gateway/realtime/response_body.py)."""
        return response_body.usage(self)

    def timings(self) -> dict[str, Any]:
        """omnistream's per-turn numbers (gateway/realtime/response_body.py)."""
        return response_body.timings(self)

    def describe(self) -> dict[str, Any]:
        """The `realtime.response` object as it stands (gateway/realtime/response_body.py)."""
        return response_body.describe(self)
