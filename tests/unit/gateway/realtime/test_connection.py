"""A client event whose handling fails unexpectedly gets an error event; the session goes on. A
session.update applies what it can: each refused setting is an error of its own, then
session.updated shows the session as it is. An item is retrieved as held; a G.711 session is
heard and answered at 8 kHz."""

from __future__ import annotations

import asyncio
import base64
import json
from types import SimpleNamespace

import numpy as np

from gateway.config import GatewayConfig
from gateway.realtime.connection import Connection
from gateway.realtime.formats import audioop
from gateway.realtime.outbound import Outbound
from omnistream.request.errors import InvalidRequest
from tests.unit.gateway.realtime.test_server_event_schemas import G711_GA, FakeSession, connect


def _connection() -> tuple[Connection, list[dict]]:
    queued: list[dict] = []
    outbound = Outbound(lambda text: asyncio.sleep(0))
    outbound.put = lambda event, owner=None, samples=0: _record(queued, event)  # type: ignore[method-assign]
    deployment = SimpleNamespace(model_id="m", voices=["ethan"], default_voice="ethan")
    core = SimpleNamespace(config=GatewayConfig(), deployment=deployment)
    return Connection(core, outbound, beta=False, model=None), queued  # type: ignore[arg-type]


async def _record(queued: list[dict], event: dict | None) -> None:
    if event is not None:
        queued.append(event)


def test_a_bug_while_handling_an_event_becomes_an_error_event_and_the_session_lives_on():
    async def run() -> list[dict]:
        conn, queued = _connection()

        async def broken(event) -> None:
            raise KeyError("a bug")

        conn._dispatch = broken  # type: ignore[method-assign]
        await conn.handle_text(json.dumps({"type": "input_audio_buffer.clear", "event_id": "e1"}))

        async def refused(event) -> None:
            raise InvalidRequest("unknown voice 'x'", field="voice")

        conn._dispatch = refused  # type: ignore[method-assign]
        await conn.handle_text(json.dumps({"type": "input_audio_buffer.clear", "event_id": "e2"}))
        return queued

    first, second = asyncio.run(run())
    assert first["type"] == "error" and first["error"]["type"] == "server_error"
    assert first["error"]["event_id"] == "e1" and "KeyError" in first["error"]["message"]
    assert second["error"]["message"] == "unknown voice 'x'" and second["error"]["event_id"] == "e2"
    assert second["error"]["param"] == "voice"


def test_a_session_update_refuses_each_bad_setting_alone_and_applies_the_rest():
    async def run() -> list[dict]:
        conn, queued = _connection()
        session = {
            "instructions": "Be kind.",
            "voice": "nobody",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}},
        }
        await conn.handle_text(json.dumps({"type": "session.update", "event_id": "u1", "session": session}))
        return queued

    *errors, updated = asyncio.run(run())
    assert [(e["type"], e["error"]["event_id"]) for e in errors] == [("error", "u1")] * 2
    assert sorted(e["error"]["param"] for e in errors) == ["session.audio.input.format.rate", "session.voice"]
    assert updated["type"] == "session.updated" and updated["session"]["instructions"] == "Be kind."
    assert updated["session"]["audio"]["output"]["voice"] == "ethan"  # the voice it had


def test_the_agents_sdks_first_update_is_applied_whole():
    """Issue 58: semantic_vad and voice `ash` (the Agents SDK's defaults) were refused, and the
    agent's instructions and tools with them."""

    async def run() -> tuple[Connection, list[dict]]:
        conn, queued = _connection()
        session = {
            "type": "realtime",
            "instructions": "Be kind.",
            "audio": {
                "input": {"turn_detection": {"type": "semantic_vad", "interrupt_response": True}},
                "output": {"voice": "ash"},
            },
            "tools": [{"type": "function", "name": "f"}],
        }
        await conn.handle_text(json.dumps({"type": "session.update", "session": session}))
        return conn, queued

    conn, queued = asyncio.run(run())
    (updated,) = queued
    session = updated["session"]
    assert session["instructions"] == "Be kind." and [t["name"] for t in session["tools"]] == ["f"]
    assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert session["audio"]["output"]["voice"] == "ash" and session["omnistream"]["voice"] == "ethan"
    assert conn.input_audio.detector is not None and conn.input_audio.detector.silence_duration_ms == 800


def test_an_item_is_retrieved_as_the_conversation_holds_it_and_an_unknown_one_is_an_error():
    async def run() -> list[dict]:
        _, _, events, send = connect(beta=False)
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
        await send(type="conversation.item.create", item={**item, "id": "item_1"})
        await send(type="conversation.item.retrieve", event_id="r1", item_id="item_1")
        await send(type="conversation.item.retrieve", event_id="r2", item_id="nope")
        return events

    events = asyncio.run(run())
    added = next(e for e in events if e["type"] == "conversation.item.added")
    retrieved = next(e for e in events if e["type"] == "conversation.item.retrieved")
    assert retrieved["item"] == added["item"]
    error = events[-1]["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("item_not_found", "item_id", "r2")


def test_a_g711_session_hears_8_khz_appends_and_answers_in_whole_g711_bytes_truncated_in_ms():
    """A telephone bridge's session: mu-law in (the VAD and the buffer see the 24 kHz stream),
    A-law out at 8 kHz (one byte a sample), and a truncation at audio_end_ms of the 8 kHz audio."""

    async def run() -> list[dict]:
        conn, core, events, send = connect(beta=False)
        await send(type="session.update", session={**G711_GA, "output_modalities": ["audio"]})
        await send(type="input_audio_buffer.append", audio=base64.b64encode(b"\xff" * 8000).decode())  # 1 s
        assert abs(conn.input_audio.buffer.end - 24000) <= 64  # a second of the 24 kHz stream
        await send(type="input_audio_buffer.commit")
        core.answers.append(FakeSession("Hello", audio=True))  # 2400 samples at 24 kHz: 100 ms
        await send(type="response.create")
        item = conn.response.item if conn.response else None
        assert item is not None
        await send(type="conversation.item.truncate", item_id=item.id, content_index=0, audio_end_ms=100)
        await send(type="conversation.item.truncate", item_id=item.id, content_index=0, audio_end_ms=101)
        return events

    events = asyncio.run(run())
    updated = [e for e in events if e["type"] == "session.updated"][-1]["session"]["audio"]
    assert (updated["input"]["format"], updated["output"]["format"]) == (
        {"type": "audio/pcmu"},
        {"type": "audio/pcma"},
    )
    assert any(e["type"] == "input_audio_buffer.committed" for e in events)
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) == 800  # 100 ms at 8 kHz
    assert np.allclose(np.frombuffer(audioop.alaw2lin(audio, 2), "<i2")[100:700] / 32767, 0.1, atol=0.01)
    truncated = [e for e in events if e["type"] == "conversation.item.truncated"]
    assert [e["audio_end_ms"] for e in truncated] == [100]  # all 100 ms were sent: 101 is past them
    assert events[-1]["type"] == "error" and events[-1]["error"]["param"] == "audio_end_ms"
