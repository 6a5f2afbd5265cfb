"""A client event whose handling fails unexpectedly gets an error event; the session goes on."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

from gateway.config import GatewayConfig
from gateway.realtime.connection import Connection
from gateway.realtime.outbound import Outbound
from omnistream.request.errors import InvalidRequest


def _connection() -> tuple[Connection, list[dict]]:
    queued: list[dict] = []
    outbound = Outbound(lambda text: asyncio.sleep(0))
    outbound.put = lambda event, owner=None, samples=0: _record(queued, event)  # type: ignore[method-assign]
    core = SimpleNamespace(config=GatewayConfig(), deployment=SimpleNamespace(model_id="m", voices=["ethan"]))
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
