"""The `/v1/realtime` WebSocket route: authentication, the session bound, the loops of one socket.

Auth follows the REST rule (`Authorization: Bearer <key>` when the gateway has a key); browsers,
which cannot set headers on a WebSocket, may give the key as OpenAI's
`openai-insecure-api-key.<key>` subprotocol. A refused key is an HTTP 401 at the handshake.

Admission: open sessions are bounded by `realtime_max_sessions` (a session over the bound gets an
`error` event, code `session_limit_reached`, and close code 1013, try again later); each response
then takes an admission slot like a REST request while it runs, so realtime and REST share the
stages' capacity and an idle session costs the stages nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from prometheus_client import Counter, Gauge

from gateway.api.openai.errors import error_body
from gateway.realtime.connection import Connection
from gateway.realtime.outbound import Outbound
from gateway.realtime.protocol import Protocol
from gateway.serving.core import GatewayCore
from gateway.serving.tracing import remote_parent
from omnistream.service.security import bearer_matches

KEY_PROTOCOL = "openai-insecure-api-key."
BETA_PROTOCOL = "openai-beta.realtime-v1"
TRY_AGAIN_LATER = 1013
CLOSE_DRAIN_S = 2.0
LOOP_STALL_S = 0.25  # a watchdog nap late by more than this: the loop was stalled, not the client idle


class RealtimeState:
    def __init__(self, core: GatewayCore) -> None:
        self.core = core
        self.sessions = 0
        registry = core.metrics.registry
        self.open_sessions = Gauge(
            "omnistream_realtime_sessions", "Open /v1/realtime sessions", registry=registry
        )
        self.refused = Counter(
            "omnistream_realtime_sessions_refused_total",
            "Realtime sessions refused, by reason",
            ["reason"],
            registry=registry,
        )
        self.barge_ins = Counter(
            "omnistream_realtime_barge_ins_total",
            "Responses cancelled because the user spoke",
            registry=registry,
        )
        self.history_dropped = Counter(
            "omnistream_realtime_history_dropped_items_total",
            "Conversation items dropped from a session's history, by the bound they would pass "
            "(context: the thinker's context; message_size, prompt_chars: what one stage message "
            "carries; max_items, audio_seconds: the optional caps)",
            ["reason"],
            registry=registry,
        )

    def dropped(self, reason: str, count: int) -> None:
        self.history_dropped.labels(reason=reason).inc(count)


def _authorized(websocket: WebSocket, api_key: str | None) -> bool:
    if not api_key:
        return True
    if bearer_matches(websocket.headers.get("authorization"), api_key):
        return True
    return any(
        p.startswith(KEY_PROTOCOL) and bearer_matches(f"Bearer {p[len(KEY_PROTOCOL) :]}", api_key)
        for p in websocket.scope.get("subprotocols", [])
    )


def _subprotocol(offered: list[str]) -> str | None:
    """The subprotocol to accept: `realtime` when offered (browsers fail a handshake that picks
    none of those they offered), else one that does not echo the key back."""
    if "realtime" in offered:
        return "realtime"
    plain = [p for p in offered if not p.startswith(KEY_PROTOCOL)]
    candidates = plain or offered
    return candidates[0] if candidates else None


async def _refuse(websocket: WebSocket, protocol: Protocol, message: str, code: str, close: int) -> None:
    await websocket.send_text(json.dumps(protocol.error(message, code, error_type="server_error")))
    await websocket.close(close, message[:120])


def add_realtime_route(app: FastAPI, core: GatewayCore) -> None:
    state = RealtimeState(core)

    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        config = core.config
        offered = list(websocket.scope.get("subprotocols", []))
        if not _authorized(websocket, config.api_key):
            body = error_body(
                401, "missing or invalid API key (Authorization: Bearer <key>)", "unauthenticated", None
            )
            if "websocket.http.response" in websocket.scope.get("extensions", {}):
                await websocket.send_denial_response(
                    JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                )
            else:
                await websocket.close(1008)
            return
        beta = "realtime=v1" in websocket.headers.get("openai-beta", "") or BETA_PROTOCOL in offered
        await websocket.accept(subprotocol=_subprotocol(offered))
        protocol = Protocol(beta)
        if not core.ready:
            state.refused.labels(reason="unavailable").inc()
            await _refuse(
                websocket,
                protocol,
                "no thinker replica is ready: nothing can be served now",
                "unavailable",
                TRY_AGAIN_LATER,
            )
            return
        if state.sessions >= config.realtime_max_sessions:
            state.refused.labels(reason="sessions").inc()
            await _refuse(
                websocket,
                protocol,
                f"the gateway is at its limit of {config.realtime_max_sessions} realtime sessions",
                "session_limit_reached",
                TRY_AGAIN_LATER,
            )
            return
        state.sessions += 1
        state.open_sessions.inc()
        try:
            with remote_parent(websocket.headers):  # the upgrade's traceparent: each response's parent
                await _serve(websocket, core, state, beta)
        finally:
            state.sessions -= 1
            state.open_sessions.dec()


async def _serve(websocket: WebSocket, core: GatewayCore, state: RealtimeState, beta: bool) -> None:
    outbound = Outbound(websocket.send_text)
    model = websocket.query_params.get("model")
    conn = Connection(core, outbound, beta, model, state.barge_ins.inc, state.dropped)
    await conn.open()  # session.created is the first event, before any client event is read
    sender = asyncio.create_task(outbound.run())
    watchdog = asyncio.create_task(_idle_watchdog(websocket, conn, core.config.realtime_idle_timeout))
    receiver = asyncio.create_task(_receive(websocket, conn))
    try:
        # Whichever ends first ends the session: the client closed (receiver), the socket failed
        # (sender) or the session idled out (watchdog).
        await asyncio.wait({sender, watchdog, receiver}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        receiver.cancel()
        watchdog.cancel()
        outbound.close()  # first: a response ending now must not wait for room on a dead socket
        await conn.close()
        sender.cancel()
        for task in (sender, watchdog, receiver):
            with contextlib.suppress(BaseException):
                await task
        with contextlib.suppress(Exception):
            await websocket.close()


async def _receive(websocket: WebSocket, conn: Connection) -> None:
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                await conn.handle_text(message["text"])
            else:
                await conn.handle_binary()


async def _idle_watchdog(websocket: WebSocket, conn: Connection, timeout: float) -> None:
    """End a session with no client event and no response for `timeout` seconds.

    Time the event loop could not run (a starved process: its nap overslept) is not the client's:
    what the client sent meanwhile waits unread in the socket, so that time is not counted as
    idle (CI saw a client appending every 0.5 s closed for idling after a 4 s stall)."""
    while True:
        if not conn.idle:
            conn.last_activity = time.monotonic()
        left = conn.last_activity + timeout - time.monotonic()
        if left <= 0:
            break
        nap = min(left, 1.0)
        due = time.monotonic() + nap
        await asyncio.sleep(nap)
        overslept = time.monotonic() - due
        if overslept > LOOP_STALL_S:
            conn.last_activity += overslept
    error = conn.protocol.error(
        f"the session was idle for {timeout:g} s", "session_idle_timeout", error_type="invalid_request_error"
    )
    with contextlib.suppress(TimeoutError):  # a client that reads nothing gets the close alone
        await asyncio.wait_for(conn.outbound.put(error), CLOSE_DRAIN_S)
    await conn.outbound.drain(CLOSE_DRAIN_S)
    await websocket.close(1000, "idle timeout")
