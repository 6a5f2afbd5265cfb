"""Every server event of a session, GA and beta, validates against the official SDKs' schemas
(tests/realtime_schemas.py: openai-python's models in strict mode with no unknown field, and the
Agents SDK's own parsing), here on fake stages so that each kind of event is made: session
updates (one with the Agents SDK's defaults, one with a refused setting), a spoken answer cut by
the user's speech and truncated, the turn's transcript and one that fails, a text answer, a tool
call and its result, a deleted item, a failed response, G.711 formats, a retrieved item, an
out-of-band answer, and errors.
tests/integration/test_realtime_schemas.py does it on the real stack."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gateway.config import GatewayConfig
from gateway.media.decode_pool import MediaDecoder
from gateway.media.limits import MediaLimits
from gateway.realtime.connection import Connection
from gateway.realtime.outbound import Outbound
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.session import Timings
from omnistream.request.errors import InvalidRequest, Overloaded
from omnistream.request.generation import AudioEvent, DoneEvent, GenerationRequest, TextEvent
from tests.realtime_schemas import check_server_events

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object", "properties": {}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>'
AGENTS_UPDATE = {  # openai-agents 0.24's first session.update (RealtimeRunner's defaults)
    "type": "realtime",
    "audio": {
        "input": {
            "format": {"rate": 24000, "type": "audio/pcm"},
            "transcription": {"model": "gpt-4o-mini-transcribe"},
            "turn_detection": {"type": "semantic_vad", "interrupt_response": True},
        },
        "output": {"format": {"rate": 24000, "type": "audio/pcm"}, "voice": "ash"},
    },
    "instructions": "Be kind.",
    "model": "gpt-realtime-2.1",
    "output_modalities": ["audio"],
    "tools": [WEATHER],
}

G711_GA = {
    "audio": {"input": {"format": {"type": "audio/pcmu"}}, "output": {"format": {"type": "audio/pcma"}}}
}
G711_BETA = {"input_audio_format": "g711_ulaw", "output_audio_format": "g711_alaw"}
OUT_OF_BAND = {
    "conversation": "none",
    "metadata": {"topic": "aside"},
    "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Sum up"}]}],
}


class FakeSession:
    """An answer: its text and audio, then (with `hold`) a wait a barge-in lands in."""

    def __init__(self, text: str, audio: bool, hold: asyncio.Event | None = None, length: bool = False):
        self.text, self.audio, self.hold, self.length = text, audio, hold, length
        self.replica_addresses: dict[str, str] = {}
        self.timings = Timings(0.0)
        self.first_chunk_s = 0.16 if audio else None  # the planner's 2 frames
        self.trace = None  # the request's span: none, as with tracing off

    async def events(self) -> AsyncIterator[Any]:
        yield TextEvent([1], self.text)
        if self.audio:
            yield AudioEvent(np.full(2400, 0.1, np.float32), 0, 24000)
        await asyncio.sleep(0)
        if self.hold is not None:
            await self.hold.wait()
        yield DoneEvent([0] * 4, [1] * 2, "length" if self.length else "stop", 1, 2400, None, None, 0.0)

    def listening(self) -> Any:
        return SimpleNamespace(heard=False)

    async def aclose(self) -> None:
        pass


class FakeCore:
    def __init__(self) -> None:
        self.config = GatewayConfig()
        self.metrics = GatewayMetrics()
        self.deployment = SimpleNamespace(
            model_id="qwen3-omni",
            voices=("chelsie", "ethan", "aiden"),
            default_voice="ethan",
            input_modalities=("text", "audio"),
            max_model_len=4096,
        )
        self.media = MediaDecoder(MediaLimits())
        self.replicas = SimpleNamespace(release_cache_soon=lambda scope: None)
        self.sent_audio = SimpleNamespace(release=lambda scope: None)
        self.answers: list[FakeSession | Exception] = []
        self.transcripts: list[FakeSession | Exception] = []  # the background requests' (default: words)

    async def open(self, request: GenerationRequest, trace: Any = None) -> FakeSession:
        if request.background:  # a transcription of the user's audio
            answer = self.transcripts.pop(0) if self.transcripts else FakeSession("Hello", audio=False)
        else:
            answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


Send = Callable[..., Awaitable[None]]


def connect(beta: bool) -> tuple[Connection, FakeCore, list[dict], Send]:
    """A connection on fake stages: the events it sends, and `send(**event)`, which hands it a
    client event and waits for the response that starts, if one does."""
    events: list[dict] = []

    async def put(event: dict | None, owner: Any = None, samples: int = 0) -> None:
        if event is not None:
            events.append(event)
            if owner is not None and samples:
                owner.sent(samples)

    outbound = Outbound(lambda text: asyncio.sleep(0))
    outbound.put = put  # type: ignore[method-assign]
    core = FakeCore()
    conn = Connection(core, outbound, beta, "omnistream")  # type: ignore[arg-type]

    async def send(**event: Any) -> None:
        await conn.handle_text(json.dumps(event))
        if conn.response is not None:
            await conn.response.wait()

    return conn, core, events, send


async def session(beta: bool) -> list[dict]:
    conn, core, events, send = connect(beta)
    await conn.open()
    await send(type="session.update", session=AGENTS_UPDATE)
    await send(type="session.update", event_id="bad", session={"voice": "nobody", "instructions": "x"})
    # A spoken turn found by the VAD, answered, and cut by the user's next turn (a barge-in).
    hold = asyncio.Event()
    core.answers.append(FakeSession("Hello there", audio=True, hold=hold))
    await send(type="input_audio_buffer.append", audio="AAAA" * 4000)  # 0.25 s of silence
    await conn.input_audio.speech_started(0)
    await conn.input_audio.speech_stopped(12000)
    await asyncio.sleep(0.01)
    await conn.input_audio.speech_started(12000)
    assert conn.response is not None and conn.response.status == "cancelled"
    spoken = conn.response.item.id
    await send(type="input_audio_buffer.clear")
    # The turn's transcript (the session asked for it), and one that fails.
    await asyncio.gather(*conn.transcriber.running.values())
    core.transcripts.append(Overloaded("the thinker is full"))
    await send(type="input_audio_buffer.append", audio="AAAA" * 4000)
    await send(type="input_audio_buffer.commit")
    await asyncio.gather(*conn.transcriber.running.values())
    # A text answer cut at max_output_tokens, a tool call and its result, a failed response.
    await send(type="conversation.item.create", item={"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "Hi"}]})  # fmt: skip
    core.answers.append(FakeSession("Hi!", audio=False, length=True))
    await send(type="response.create", response={"output_modalities": ["text"]})
    core.answers.append(FakeSession(CALL, audio=False))
    await send(type="response.create", response={"tool_choice": "required"})
    call = next(e for e in reversed(events) if e["type"] == "response.done")["response"]["output"][0]
    await send(type="conversation.item.create",
               item={"type": "function_call_output", "call_id": call["call_id"], "output": "{}"})  # fmt: skip
    # A call cut at max_output_tokens: listed incomplete in response.done (issue 59).
    core.answers.append(FakeSession(CALL[: CALL.index("{}") + 1], audio=False, length=True))
    await send(type="response.create", response={"tool_choice": "required"})
    core.answers.append(InvalidRequest("unknown voice 'x'", field="voice"))
    await send(type="response.create")
    # Telephone audio (G.711 both ways), an item retrieved, an out-of-band answer with metadata.
    await send(type="session.update", session=G711_BETA if beta else G711_GA)
    await send(type="conversation.item.retrieve", item_id=spoken)
    core.answers.append(FakeSession("Aside.", audio=True))
    await send(type="response.create", response=OUT_OF_BAND)
    # Truncate and delete the spoken answer; errors of every kind.
    await send(type="conversation.item.truncate", item_id=spoken, content_index=0, audio_end_ms=10)
    await send(type="conversation.item.delete", item_id=spoken)
    await send(type="conversation.item.delete", event_id="gone", item_id=spoken)
    await send(type="response.cancel", event_id="none")
    await send(type="no.such.event", event_id="u")
    await conn.handle_text("{not json")
    await conn.close()
    return events


@pytest.mark.parametrize("beta", [False, True])
def test_every_server_event_validates_against_the_sdks_schemas(beta):
    events = asyncio.run(session(beta))
    kinds = {e["type"] for e in events}
    # What the session made: every kind of event a spoken turn, a barge-in and a call need.
    audio = "response.audio.delta" if beta else "response.output_audio.delta"
    added = "conversation.item.created" if beta else "conversation.item.added"
    assert {audio, added, "response.content_part.added", "response.function_call_arguments.done"} <= kinds
    assert {"input_audio_buffer.speech_started", "conversation.item.truncated", "error"} <= kinds
    statuses = [e["response"]["status"] for e in events if e["type"] == "response.done"]
    assert statuses == ["cancelled", "incomplete", "completed", "incomplete", "failed", "completed"]
    cut = [e for e in events if e["type"] == "response.done"][3]["response"]["output"]
    assert [(o["type"], o["status"], o["arguments"]) for o in cut] == [("function_call", "incomplete", "{")]
    assert {"conversation.item.retrieved"} <= kinds
    transcription = "conversation.item.input_audio_transcription"
    assert {f"{transcription}.{end}" for end in ("delta", "completed", "failed")} <= kinds
    assert check_server_events(events, beta) == []
