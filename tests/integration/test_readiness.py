"""Readiness per need, on real processes: a gateway over a thinker alone serves text chat (REST
with `modalities: ["text"]`, gRPC Generate without audio, a realtime session with text output)
and transcriptions, and refuses audio with 503 / UNAVAILABLE naming the missing stages; `/ready`,
`/v1/models` and Gateway/Info say what is served (gateway/cluster/readiness.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets

from omnistream.client import Client, TextDelta
from omnistream.client import Unavailable as ClientUnavailable
from tests.media_files import audio_file

from .conftest import gateway_process, gateway_url, wait_for

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def thinker_only(stages):
    """A gateway that knows the session's thinker alone: no talker, no code2wav (a thinker of the
    same flags as one started here would be, without starting another one)."""
    with gateway_process({"thinker": stages["thinker"]}) as gateway:
        base = gateway_url(gateway)
        assert asyncio.run(
            wait_for(lambda: httpx.get(f"{base}/ready", timeout=5).status_code == 200, timeout=60.0)
        )
        yield gateway


def test_ready_says_text_is_served_and_audio_lacks_talker_and_code2wav(thinker_only):
    reply = httpx.get(f"{gateway_url(thinker_only)}/ready", timeout=5)
    assert reply.status_code == 200
    body = reply.json()
    assert body["ready"] is True and body["serves"] == {"text": True, "audio": False}
    assert body["missing"] == {"audio": ["talker", "code2wav"]}
    assert [r["address"] for r in body["stages"]["thinker"]] and body["stages"]["talker"] == []


def test_rest_serves_text_and_refuses_audio_naming_the_stages(thinker_only):
    base = gateway_url(thinker_only)
    body = {"messages": HELLO, "max_tokens": 8, "seed": 1}
    text = httpx.post(f"{base}/v1/chat/completions", json={**body, "modalities": ["text"]}, timeout=60)
    assert text.status_code == 200, text.text
    message = text.json()["choices"][0]["message"]
    assert isinstance(message["content"], str) and not message.get("audio")
    assert text.json()["usage"]["completion_tokens"] > 0
    for path, payload in (
        ("/v1/chat/completions", body),  # audio is the default
        ("/v1/audio/speech", {"model": "qwen3-omni", "input": "Hello", "voice": "ethan"}),
    ):
        audio = httpx.post(f"{base}{path}", json=payload, timeout=60)
        assert audio.status_code == 503, (path, audio.text)
        error = audio.json()["error"]
        assert error["code"] == "unavailable" and "talker" in error["message"], error
    # A transcription needs the thinker only.
    files = {"file": ("tone.wav", audio_file("wav", 0.5), "audio/wav")}
    heard = httpx.post(
        f"{base}/v1/audio/transcriptions", data={"model": "whisper-1"}, files=files, timeout=60
    )
    assert heard.status_code == 200 and isinstance(heard.json()["text"], str), heard.text
    # The model is known from the thinker: listed, speaking nothing.
    (model,) = httpx.get(f"{base}/v1/models", timeout=5).json()["data"]
    assert model["id"] == "qwen3-omni" and model["omnistream"]["output_modalities"] == ["text"]


def test_grpc_generates_text_and_refuses_audio(thinker_only):
    with Client(thinker_only.address, retries=0) as client:
        info = client.info()
        assert info.model_id == "qwen3-omni" and list(info.output_modalities) == ["text"]
        events = list(client.generate(HELLO, audio=False, max_tokens=8, seed=1))
        assert any(isinstance(e, TextDelta) and e.token_ids for e in events)
        with pytest.raises(ClientUnavailable) as refused:
            list(client.generate(HELLO, max_tokens=8))
        assert "talker" in str(refused.value)


def test_realtime_session_with_text_output(thinker_only):
    async def run() -> tuple[list[dict], dict]:
        url = f"ws://127.0.0.1:{thinker_only.http_port}/v1/realtime?model=omnistream"
        async with websockets.connect(url, max_size=None) as ws:
            seen: list[dict] = []

            async def until(kind: str) -> dict:
                async with asyncio.timeout(60):
                    while True:
                        event = json.loads(await ws.recv())
                        seen.append(event)
                        if event["type"] == kind:
                            return event

            await until("session.created")
            session = {"type": "realtime", "output_modalities": ["text"], "max_output_tokens": 8}
            session["audio"] = {"input": {"turn_detection": None}}
            await ws.send(json.dumps({"type": "session.update", "session": session}))
            await until("session.updated")
            item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]}
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
            await ws.send(json.dumps({"type": "response.create"}))
            done = await until("response.done")
            return seen, done

    seen, done = asyncio.run(run())
    assert done["response"]["status"] in ("completed", "incomplete"), done
    assert [e for e in seen if e["type"] == "response.output_text.delta"]
    assert not [e for e in seen if e["type"] == "response.output_audio.delta"]
