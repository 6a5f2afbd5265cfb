"""The transcripts of the user's spoken turns (`audio.input.transcription`): each committed user
audio item gets `conversation.item.input_audio_transcription.delta` events as its words are made,
then `.completed` with the transcript and its usage (or `.failed`, naming the error), and the item
keeps the transcript (what conversation.item.retrieve and the Agents SDKs' history show).

The thinker itself transcribes (gateway/serving/transcription.py): background work that never
delays a spoken answer, so a turn's transcript usually arrives after its answer's words, as
OpenAI allows ("may come before or after the Response events"). Its own owner because these run
beside the responses, one task per item, ended with the session or when the item is deleted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from gateway.realtime.conversation import Item
from gateway.realtime.settings import InputTranscription
from gateway.serving.core import GatewayCore
from gateway.serving.tracing import transcription_entry
from gateway.serving.transcription import Transcription, transcription_request
from omnistream.request.defaults import ServingDefaults
from omnistream.request.errors import InternalError, InvalidRequest, OmniError, Overloaded

log = logging.getLogger(__name__)

Send = Callable[..., Awaitable[None]]  # Connection.send: (kind, **fields)
# Transcriptions a session may have running; a turn committed past it gets `.failed` (a client
# that commits faster than the thinker transcribes falls behind, not the server's memory).
MAX_RUNNING = 4
PREFIX = "conversation.item.input_audio_transcription"


class InputTranscriber:
    def __init__(self, core: GatewayCore, send: Send, session_id: str) -> None:
        self.core = core
        self.send = send
        self.session_id = session_id  # for the logs
        self.running: dict[str, asyncio.Task[None]] = {}

    def start(self, item: Item, asked: InputTranscription) -> None:
        """Transcribe the user audio item `item` (a committed turn: its first part is the audio)."""
        task = asyncio.create_task(self._run(item, asked), name=f"transcribe {item.id}")
        self.running[item.id] = task
        task.add_done_callback(lambda _: self.running.pop(item.id, None))

    async def _run(self, item: Item, asked: InputTranscription) -> None:
        try:
            if len(self.running) > MAX_RUNNING:
                raise Overloaded(f"{MAX_RUNNING} transcriptions of this session are running already")
            known = self.core.deployment
            deployment = ServingDefaults.of(self.core.config, known.voices, known.default_voice)
            audio = next(p for p in item.parts if p["type"] == "audio")
            request = transcription_request(
                audio, item.audio_seconds, deployment, asked.spoken, asked.context
            )
            run = Transcription(self.core, request, item.audio_seconds, transcription_entry(item.id))
            async for delta in run.deltas():
                await self.send(f"{PREFIX}.delta", item_id=item.id, content_index=0, delta=delta)
        except OmniError as exc:
            await self._failed(item, exc)
            return
        except Exception as exc:  # a bug: this item's transcript fails, the session lives on
            log.exception("realtime session %s: transcribing %s failed", self.session_id, item.id)
            await self._failed(item, InternalError(f"internal error ({type(exc).__name__})"))
            return
        transcript = run.transcript
        assert transcript is not None, "a transcription ended without its summary"
        item.content[0]["transcript"] = transcript.text
        await self.send(
            f"{PREFIX}.completed",
            item_id=item.id,
            content_index=0,
            transcript=transcript.text,
            usage=transcript.usage(),
        )

    async def _failed(self, item: Item, exc: OmniError) -> None:
        kind = "invalid_request_error" if isinstance(exc, InvalidRequest) else "server_error"
        error = {"type": kind, "code": exc.kind, "message": exc.message, "param": exc.field}
        await self.send(f"{PREFIX}.failed", item_id=item.id, content_index=0, error=error)

    async def forget(self, item_id: str) -> None:
        """The item left the conversation: its transcription, if it still runs, ends unsent."""
        task = self.running.pop(item_id, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        """The session ends: every transcription stops, so its thinker request is freed."""
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
