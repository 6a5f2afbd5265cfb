"""/v1/realtime's protocol with a raw WebSocket client, on the real processes: every client event
type, both namings, bad frames and events (an error naming the event, the session lives on), the
limits (appends too large, too fast, past the buffer; sessions; idle), auth, and a client that
closes mid-response (every stage freed)."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest
import websockets

from tests.integration.conftest import configured_gateway, gateway_idle, wait_for
from tests.media_files import image_file
from tests.speech import silence_pcm16, speech_pcm16

API_KEY = "protocol-test-key"
LIMITS = {
    "api_key": API_KEY,
    "realtime_max_sessions": 3,
    # long enough that a session waiting on the gateway is not closed by a starved CI machine (a
    # 25 s run saw its session idle out waiting for speech_stopped), short enough to test in seconds
    "realtime_idle_timeout": 8.0,
    "realtime_max_buffer_seconds": 2.0,
    "realtime_append_burst_seconds": 3.0,
}
NO_VAD = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    with configured_gateway(stages, tmp_path_factory.mktemp("realtime-protocol"), LIMITS) as gw:
        yield gw


def url(gateway) -> str:
    return f"ws://127.0.0.1:{gateway.http_port}/v1/realtime?model=omnistream"


def connect(gateway, beta: bool = False, key: str | None = API_KEY, **kwargs):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if beta:
        headers["OpenAI-Beta"] = "realtime=v1"
    return websockets.connect(url(gateway), additional_headers=headers, max_size=None, **kwargs)


class Client:
    """Sends events, reads server events in order."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.seen: list[dict] = []

    async def send(self, event: dict) -> None:
        await self.ws.send(json.dumps(event))

    async def next(self, timeout: float = 60.0) -> dict:
        try:
            event = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        except websockets.ConnectionClosed as closed:  # say what the session saw before it ended
            seen = [e.get("type") for e in self.seen]
            raise AssertionError(f"the session closed ({closed}) after {seen}: {self.seen[-3:]}") from closed
        self.seen.append(event)
        return event

    async def until(self, kind: str, timeout: float = 120.0, where=lambda event: True) -> dict:
        async with asyncio.timeout(timeout):
            while True:
                event = await self.next(timeout)
                if event["type"] == kind and where(event):
                    return event

    async def error(self) -> dict:
        event = await self.until("error")
        return event["error"]


def b64(pcm: bytes) -> str:
    return base64.b64encode(pcm).decode()


async def opened(ws) -> Client:
    client = Client(ws)
    created = await client.next()
    assert created["type"] == "session.created"
    return client


def test_every_client_event_type(gateway, stages):
    async def run():
        async with connect(gateway) as ws:
            c = await opened(ws)
            await c.send(
                {
                    "type": "session.update",
                    "event_id": "e1",
                    # seeded and past EOS: a sampled first token that ends the answer (or bytes the
                    # detokenizer holds) must not leave the text response below without a delta
                    "session": {
                        **NO_VAD,
                        "max_output_tokens": 6,
                        "omnistream": {"ignore_eos": True, "seed": 3},
                    },
                }
            )
            updated = await c.until("session.updated")
            assert updated["session"]["audio"]["input"]["turn_detection"] is None
            assert updated["session"]["max_output_tokens"] == 6

            # conversation.item.create: text; input_audio buffer: append, clear, append, commit
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "Hi!"}]}})  # fmt: skip
            added = await c.until("conversation.item.added")
            assert added["item"]["content"] == [{"type": "input_text", "text": "Hi!"}]
            await c.until("conversation.item.done")
            await c.send({"type": "input_audio_buffer.append", "audio": b64(silence_pcm16(0.2))})
            await c.send({"type": "input_audio_buffer.clear"})
            await c.until("input_audio_buffer.cleared")
            await c.send({"type": "input_audio_buffer.commit", "event_id": "empty"})
            error = await c.error()
            assert error["code"] == "input_audio_buffer_commit_empty" and error["event_id"] == "empty"
            await c.send({"type": "input_audio_buffer.append", "audio": b64(speech_pcm16("Hello there."))})
            await c.send({"type": "input_audio_buffer.commit"})
            committed = await c.until("input_audio_buffer.committed")
            user_audio = await c.until("conversation.item.added")
            assert user_audio["item"]["id"] == committed["item_id"]
            assert user_audio["item"]["content"][0]["type"] == "input_audio"

            # an item with an image, audio and text (what the playground attaches)
            png = "data:image/png;base64," + base64.b64encode(image_file()).decode()
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                          "content": [{"type": "input_image", "image_url": png},
                                      {"type": "input_audio", "audio": b64(speech_pcm16("What is this?"))},
                                      {"type": "input_text", "text": "Describe it."}]}})  # fmt: skip
            media = (await c.until("conversation.item.done", where=lambda e: len(e["item"]["content"]) == 3))[
                "item"
            ]
            assert [p["type"] for p in media["content"]] == ["input_image", "input_audio", "input_text"]

            # response.create, text only: output_text deltas, response.done with usage
            await c.send({"type": "response.create", "response": {"output_modalities": ["text"]}})
            created = await c.until("response.created")
            assert created["response"]["status"] == "in_progress"
            delta = await c.until("response.output_text.delta")
            assert delta["response_id"] == created["response"]["id"]
            done = await c.until("response.done")
            assert done["response"]["status"] in ("completed", "incomplete")
            assert done["response"]["usage"]["output_tokens"] > 0
            assert not [e for e in c.seen if e["type"] == "response.output_audio.delta"]

            # response.create with audio, response.cancel mid-way, truncate and delete its item
            await c.send({"type": "session.update", "session": {"max_output_tokens": 1000,
                          "omnistream": {"ignore_eos": True}}})  # fmt: skip
            await c.until("session.updated")
            await c.send({"type": "response.create"})
            first = await c.until("response.output_audio.delta")
            await c.send({"type": "response.cancel", "event_id": "cancel-1"})
            done = await c.until("response.done")
            assert done["response"]["status"] == "cancelled"
            assert done["response"]["status_details"]["reason"] == "client_cancelled"
            item_id = first["item_id"]
            assert done["response"]["output"][0]["id"] == item_id
            assert await wait_for(lambda: gateway_idle(gateway, stages), 10)
            await c.send({"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0,
                          "audio_end_ms": 0})  # fmt: skip
            truncated = await c.until("conversation.item.truncated")
            assert truncated["audio_end_ms"] == 0
            await c.send({"type": "conversation.item.truncate", "event_id": "far", "item_id": item_id,
                          "content_index": 0, "audio_end_ms": 10**7})  # fmt: skip
            assert (await c.error())["param"] == "audio_end_ms"
            await c.send({"type": "conversation.item.delete", "item_id": item_id})
            assert (await c.until("conversation.item.deleted"))["item_id"] == item_id
            await c.send({"type": "response.cancel", "event_id": "none-active"})
            error = await c.error()
            assert error["code"] == "response_cancel_not_active" and error["event_id"] == "none-active"

    asyncio.run(run())


def test_beta_names(gateway):
    async def run():
        async with connect(gateway, beta=True) as ws:
            c = await opened(ws)
            assert c.seen[0]["session"]["input_audio_format"] == "pcm16"
            await c.send({"type": "session.update", "session": {"modalities": ["text", "audio"],
                          "turn_detection": None, "max_response_output_tokens": 4,
                          "omnistream": {"max_audio_frames": 20}}})  # fmt: skip
            updated = await c.until("session.updated")
            assert updated["session"]["turn_detection"] is None
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "Hello"}]}})  # fmt: skip
            await c.until("conversation.item.created")
            await c.send({"type": "response.create"})
            await c.until("response.done")
            kinds = {e["type"] for e in c.seen}
            assert {"response.audio.delta", "response.audio_transcript.delta", "response.audio.done"} <= kinds
            assert (
                not {"response.output_audio.delta", "conversation.item.added", "conversation.item.done"}
                & kinds
            )

    asyncio.run(run())


def test_bad_frames_and_events_get_errors_and_the_session_lives_on(gateway):
    async def run():
        async with connect(gateway) as ws:
            c = await opened(ws)
            await ws.send("{not json")
            assert (await c.error())["code"] == "invalid_json"
            await ws.send(b"\x00\x01binary")
            assert (await c.error())["code"] == "invalid_frame"
            await ws.send("[1, 2]")
            assert (await c.error())["code"] == "invalid_event"
            await c.send({"type": "no.such.event", "event_id": "u1"})
            error = await c.error()
            assert error["code"] == "unknown_event" and error["event_id"] == "u1"
            await c.send({"type": "session.update", "event_id": "bad", "session": {"audio": {"input": {
                "turn_detection": {"type": "server_vad", "threshold": 7}}}}})  # fmt: skip
            error = await c.error()
            assert error["event_id"] == "bad" and "threshold" in error["param"]
            await c.send({"type": "input_audio_buffer.append", "audio": "***"})
            assert (await c.error())["param"] == "audio"
            bad_image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                          "content": [bad_image]}})  # fmt: skip
            error = await c.error()
            assert error["param"].startswith("item.content.0")
            await c.send({"type": "response.create", "event_id": "r0"})
            assert (await c.error())["code"] == "conversation_empty"
            await c.send({"type": "session.update", "event_id": "v", "session": {"voice": "nobody"}})
            error = await c.error()
            assert error["event_id"] == "v" and "voice" in error["param"]
            # an answer that cannot fit the thinker's context (max_output_tokens 100000 is capped at
            # the gateway's 4096, the whole context) is refused before it starts: nothing dropped
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "Hi"}]}})  # fmt: skip
            await c.send({"type": "response.create", "event_id": "long",
                          "response": {"max_output_tokens": 100000}})  # fmt: skip
            error = await c.error()
            assert error["code"] == "context_length_exceeded" and error["event_id"] == "long"
            assert "max_output_tokens 4096" in error["message"]
            # a response refused where it runs fails alone: response.done failed, the session goes on
            await c.send({"type": "session.update", "session": {"omnistream": {"max_audio_frames": 10**9}}})
            await c.until("session.updated")
            await c.send({"type": "response.create"})
            done = await c.until("response.done")
            assert done["response"]["status"] == "failed"
            assert done["response"]["status_details"]["error"]["code"] == "invalid_request"
            await c.send({"type": "session.update", "session": {"omnistream": {}}})
            await c.until("session.updated")
            # still usable
            await c.send({"type": "session.update", "session": {"instructions": "Be brief."}})
            assert (await c.until("session.updated"))["session"]["instructions"] == "Be brief."

    asyncio.run(run())


def test_appends_too_large_too_fast_or_past_the_buffer_are_refused(gateway):
    async def run():
        async with connect(gateway) as ws:
            c = await opened(ws)
            await c.send({"type": "session.update", "session": NO_VAD})
            await c.until("session.updated")
            await c.send(
                {"type": "input_audio_buffer.append", "event_id": "huge", "audio": b64(silence_pcm16(2.5))}
            )
            error = await c.error()
            assert error["code"] == "audio_too_large" and error["event_id"] == "huge"
            await c.send({"type": "input_audio_buffer.append", "audio": b64(silence_pcm16(1.5))})
            await c.send(
                {"type": "input_audio_buffer.append", "event_id": "full", "audio": b64(silence_pcm16(1.0))}
            )
            error = await c.error()
            assert error["code"] == "input_audio_buffer_full" and error["event_id"] == "full"
            await c.send({"type": "input_audio_buffer.clear"})
            await c.until("input_audio_buffer.cleared")
            # 2.5 s of the 3 s burst are spent: another second at once runs ahead of real time
            await c.send(
                {"type": "input_audio_buffer.append", "event_id": "fast", "audio": b64(silence_pcm16(1.0))}
            )
            error = await c.error()
            assert error["code"] == "input_audio_buffer_rate_exceeded" and error["type"] == "rate_limit_error"
            await c.send({"type": "session.update", "session": {"instructions": "still here"}})
            await c.until("session.updated")

    asyncio.run(run())


def test_auth_by_header_or_browser_subprotocol(gateway):
    async def run():
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with connect(gateway, key=None):
                pass
        assert refused.value.response.status_code == 401
        with pytest.raises(websockets.InvalidStatus):
            async with connect(gateway, key="wrong"):
                pass
        protocols = ["realtime", f"openai-insecure-api-key.{API_KEY}"]
        async with websockets.connect(url(gateway), subprotocols=protocols) as ws:
            assert ws.subprotocol == "realtime"
            await opened(ws)

    asyncio.run(run())


def test_session_limit_and_idle_timeout(gateway):
    async def run():
        async with connect(gateway) as a, connect(gateway) as b, connect(gateway) as c:
            for ws in (a, b, c):
                await opened(ws)
            async with connect(gateway) as refused:
                error = json.loads(await refused.recv())
                assert error["type"] == "error" and error["error"]["code"] == "session_limit_reached"
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await refused.recv()
                assert closed.value.rcvd.code == 1013
            # idle: no event for realtime_idle_timeout seconds ends the session
            error = json.loads(await asyncio.wait_for(a.recv(), 30))
            assert error["error"]["code"] == "session_idle_timeout"
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(a.recv(), 10)

    asyncio.run(run())


def test_closing_mid_response_frees_every_stage(gateway, stages):
    async def run():
        async with connect(gateway) as ws:
            c = await opened(ws)
            await c.send({"type": "session.update", "session": {**NO_VAD, "max_output_tokens": 1000,
                          "omnistream": {"ignore_eos": True}}})  # fmt: skip
            await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                          "content": [{"type": "input_text", "text": "Talk for a long time."}]}})  # fmt: skip
            await c.send({"type": "response.create"})
            await c.until("response.output_audio.delta")
        assert await wait_for(lambda: gateway_idle(gateway, stages), 10)

    asyncio.run(run())


def test_a_frame_over_the_websocket_limit_closes_only_that_session(gateway):
    async def run():
        async with connect(gateway) as other:
            await opened(other)
            async with connect(gateway) as ws:
                await opened(ws)
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (17 * 2**20)}))
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    while True:
                        await asyncio.wait_for(ws.recv(), 30)
                assert closed.value.rcvd.code == 1009  # message too big (uvicorn's 16 MiB)
            c = Client(other)
            await c.send({"type": "session.update", "session": {"instructions": "fine"}})
            await c.until("session.updated")

    asyncio.run(run())


def test_vad_turned_on_mid_session_finds_the_turn(gateway):
    """Server VAD switched on after push-to-talk audio (as the playground does): its positions go on
    from the stream's, so the turn it hears is committed with its audio, not refused as empty."""

    async def run():
        async with connect(gateway) as ws:
            c = await opened(ws)
            await c.send({"type": "session.update", "session": NO_VAD})
            await c.until("session.updated")
            # longer than the turn that follows: a VAD counting from 0 would end it before the buffer
            await c.send({"type": "input_audio_buffer.append", "audio": b64(silence_pcm16(1.0))})
            await c.send({"type": "input_audio_buffer.commit"})
            await c.until("input_audio_buffer.committed")
            vad = {"type": "server_vad", "create_response": False}
            await c.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}})
            await c.until("session.updated")
            turn = speech_pcm16("Hello.") + silence_pcm16(0.8)
            await c.send({"type": "input_audio_buffer.append", "audio": b64(turn)})
            await c.until("input_audio_buffer.speech_stopped")
            committed = await c.until("input_audio_buffer.committed")
            assert committed["item_id"]
            assert not [e for e in c.seen if e["type"] == "error"], c.seen

    asyncio.run(run())


def test_a_server_vad_turn_longer_than_the_buffer_is_committed_not_refused(gateway):
    """Speech (or a noise the VAD takes for speech) that goes on past the buffer bound ends the turn
    there: a server-VAD client never commits or clears, so refusing its appends would wedge it."""

    async def run():
        async with connect(gateway) as ws:
            c = await opened(ws)
            vad = {"type": "server_vad", "create_response": False, "silence_duration_ms": 3000}
            await c.send({"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}})
            await c.until("session.updated")
            speech = speech_pcm16("The quick brown fox jumps over the lazy dog beside the river bank.")
            assert len(speech) / 2 / 24000 > LIMITS["realtime_max_buffer_seconds"] + 0.5
            piece = 24000 * 2 // 2  # 0.5 s
            for i, start in enumerate(range(0, len(speech), piece)):
                if i >= 4:  # past the burst the gateway allows ahead of real time: pace it
                    await asyncio.sleep(0.5)
                chunk = b64(speech[start : start + piece])
                await c.send({"type": "input_audio_buffer.append", "audio": chunk})
            await c.until("input_audio_buffer.speech_started")
            stopped = await c.until("input_audio_buffer.speech_stopped")
            committed = await c.until("input_audio_buffer.committed")
            assert committed["item_id"] == stopped["item_id"]
            assert stopped["audio_end_ms"] <= 1000 * (len(speech) / 2 / 24000)
            assert not [e for e in c.seen if e["type"] == "error"], c.seen

    asyncio.run(run())
