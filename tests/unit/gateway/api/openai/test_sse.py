"""SessionStream: a streamed answer ends its session even when the client leaves before the body."""

from __future__ import annotations

import asyncio

from gateway.api.openai.sse import SessionStream


class _Session:
    request_id = "r1"

    def __init__(self) -> None:
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


async def test_a_client_gone_before_the_first_byte_still_frees_the_session():
    session = _Session()
    started = []

    async def body():
        started.append(True)  # never reached: the response is cancelled first
        yield b"data"

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        await asyncio.sleep(3600)  # the client is gone: nothing would ever be sent

    response = SessionStream(session, body(), media_type="text/event-stream")
    scope = {"type": "http", "asgi": {"spec_version": "2.3"}, "method": "POST", "path": "/"}
    await asyncio.wait_for(response(scope, receive, send), 10)
    assert session.closed == 1 and not started


async def test_a_body_streamed_to_the_end_closes_the_session():
    session = _Session()
    sent = []

    async def body():
        yield b"a"
        yield b"b"

    async def receive():
        await asyncio.sleep(3600)

    async def send(message):
        sent.append(message)

    response = SessionStream(session, body(), media_type="application/octet-stream")
    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, "method": "POST", "path": "/"}
    await response(scope, receive, send)
    assert [m.get("body") for m in sent if m["type"] == "http.response.body"][:2] == [b"a", b"b"]
    assert session.closed == 1
