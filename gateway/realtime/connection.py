"""One realtime connection: client events in, server events out (through `Outbound`).

Every client event is handled in order on the connection's receive loop; a bad one gets an `error`
event naming it (`error.event_id`) and changes nothing, so the session stays usable. Media are
decoded when their item is made (a committed turn, an item with audio or an image), in the
gateway's decoder threads, so a response never waits on a decode and a bad file is refused once.
The connection owns the session's state and dispatches its events; the input audio buffer and its
turns are `InputAudio`'s (input_audio.py), the responses, each fitted to the thinker's context
first, `Responder`'s (responder.py).
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from gateway.api.openai.voices import speaker_for
from gateway.config import GatewayConfig
from gateway.realtime import events as ev
from gateway.realtime.audio import ms_of
from gateway.realtime.client_items import Item as GivenItem
from gateway.realtime.conversation import Conversation, HistoryLimits, Item
from gateway.realtime.events import EventError
from gateway.realtime.input_audio import InputAudio
from gateway.realtime.input_transcription import InputTranscriber
from gateway.realtime.items import created_item
from gateway.realtime.outbound import Outbound
from gateway.realtime.protocol import Protocol, new_id
from gateway.realtime.responder import Responder
from gateway.realtime.response import ResponseRun
from gateway.realtime.session_config import SessionConfig
from gateway.realtime.speculation import UNUSED
from gateway.serving.core import GatewayCore
from omnistream.request.defaults import ServingDefaults
from omnistream.request.errors import OmniError

log = logging.getLogger(__name__)


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
        self.conversation = Conversation(HistoryLimits.of(c))
        self.last_activity = time.monotonic()
        self._handling = False  # a client event is being handled
        self.on_drop = on_drop  # (reason, items): items dropped from the history
        # The session's prefix cache scope (omnistream/engine/prefix_cache.py): a secret no client
        # sees, so only this session's turns find what its turns cached; released at its close.
        self.cache_scope = secrets.token_bytes(16)
        self.responder = Responder(
            core,
            self.protocol,
            outbound,
            self.config,
            self.conversation,
            self.id,
            self.cache_scope,
            dropped=self._dropped,
            on_end=self._touch,  # the idle timeout counts from the end of a response
            make_item=self._made_item,
        )
        self.transcriber = InputTranscriber(core, self.send, self.id)
        self.input_audio = InputAudio(
            core,
            self.config,
            self.send,
            self.conversation,
            self._add_item,
            self.responder,
            self.transcriber,
            on_barge_in,
        )

    @property
    def response(self) -> ResponseRun | None:
        """The running response, or the last one (the responder's)."""
        return self.responder.response

    @property
    def busy(self) -> bool:
        return self.responder.busy

    @property
    def idle(self) -> bool:
        """No response runs and no client event is being handled (e.g. its media decoded)."""
        return not (self._handling or self.busy)

    def _touch(self) -> None:
        self.last_activity = time.monotonic()

    async def send(self, kind: str, **fields: Any) -> None:
        await self.outbound.put(self.protocol.event(kind, **fields))

    async def error(self, exc: EventError) -> None:
        await self.outbound.put(
            self.protocol.error(exc.message, exc.code, exc.param, exc.event_id, exc.error_type)
        )

    def _session(self) -> dict[str, Any]:
        """The session object: its voice as asked (or the default), and the model's that speaks."""
        voices, default = self.core.deployment.voices, self.core.deployment.default_voice
        voice = self.config.voice or ServingDefaults.of(self.core.config, voices, default).default_voice()
        speaker = speaker_for(voice, voices, default)
        return self.config.describe(self.protocol, self.id, self.model, voice, speaker)

    async def open(self) -> None:
        await self.send("session.created", session=self._session())

    # -- dispatch ------------------------------------------------------------------------------
    async def handle_text(self, text: str) -> None:
        self._touch()
        self._handling = True
        event = None
        try:
            event = ev.parse(text)
            await self._dispatch(event)
        except EventError as exc:
            await self.error(exc)
        except OmniError as exc:  # what an event brought was refused further down (e.g. its media)
            event_id = getattr(event, "event_id", None)
            await self.error(EventError.of(exc, event_id))
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
            self._touch()  # idle counts from the end of the client's last event

    async def handle_binary(self) -> None:
        self._touch()
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
                    await self.input_audio.append(event)
                case ev.BufferCommit():
                    await self.input_audio.commit(None, eid)
                case ev.BufferClear():
                    await self.input_audio.clear()
                case ev.ItemCreate():
                    await self._item_create(event)
                case ev.ItemTruncate():
                    await self._truncate(event)
                case ev.ItemDelete():
                    self.conversation.delete(event.item_id)
                    await self.transcriber.forget(event.item_id)
                    await self.send("conversation.item.deleted", item_id=event.item_id)
                case ev.ItemRetrieve():
                    item = self.conversation.get(event.item_id)
                    await self.send("conversation.item.retrieved", item=item.wire(self.protocol))
                case ev.ResponseCreate():
                    await self.responder.create(event)
                case ev.ResponseCancel():
                    await self.responder.cancel(event)
        except EventError as exc:
            exc.event_id = exc.event_id or eid
            raise

    # -- session -------------------------------------------------------------------------------
    async def _session_update(self, event: ev.SessionUpdate) -> None:
        """Apply what can be served; each setting refused is an `error` of its own, naming it, and
        session.updated follows with the session as it now is."""
        before = self.config.turn_detection
        refused = event.refused + self.config.apply(event.session, self.core.deployment.voices)
        for exc in refused:
            exc.event_id = event.event_id
            await self.error(exc)
        if self.config.turn_detection != before:
            await self.input_audio.detection_changed()
        await self.send("session.updated", session=self._session())

    # -- conversation --------------------------------------------------------------------------
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

    async def _item_create(self, event: ev.ItemCreate) -> None:
        given = event.item
        item_id = given.id or new_id("item")
        if item_id in self.conversation.items:
            raise EventError(f"an item with id {item_id!r} exists", code="duplicate_item_id", param="item.id")
        await self._add_item(await self._made_item(given, item_id, self.conversation, event.event_id))

    async def _made_item(
        self, given: GivenItem, item_id: str, conversation: Conversation, event_id: str | None
    ) -> Item:
        """An item a client gave (conversation.item.create's, or one of a response's `input`)."""
        modalities = self.core.deployment.input_modalities
        max_bytes = self.input_audio.buffer.max_bytes  # an item's audio: as much as the buffer's
        return await created_item(
            given, item_id, conversation, self.core.media, modalities, max_bytes, event_id
        )

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
        sent_ms = ms_of(item.audio_samples_sent)
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

    async def close(self) -> None:
        """The client went away (or the session ends): cancel what runs, so every stage is freed,
        and release the session's cache scope in the stages that cached its prefixes."""
        await self.responder.drop_speculation(UNUSED)
        if self.response is not None:
            await self.response.cancel("client_cancelled")
        await self.transcriber.close()
        await self.input_audio.work_ahead.close()
        self.core.replicas.release_cache_soon(self.cache_scope)
        self.core.sent_audio.release(self.cache_scope)
