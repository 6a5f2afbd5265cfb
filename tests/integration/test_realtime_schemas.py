"""Every server event of `/v1/realtime`, GA and beta, validates against the official SDKs' published
schemas (tests/realtime_schemas.py: openai-python's models in strict mode with no unknown field,
and in GA the Agents SDK's own parsing of server events), on the real processes: a session set up
as the Agents SDK sets it up (semantic_vad, voice `ash`, tools), a spoken turn found by the VAD, a
barge-in, a tool call round trip, truncate, delete, and errors (each refused setting alone). And an
Agents SDK session itself (RealtimeAgent with a tool, RealtimeRunner): not one error. And a telephone
bridge's session: G.711 in and out, a retrieve, an out-of-band answer."""

from __future__ import annotations

import asyncio
import base64

import pytest
import websockets

from gateway.realtime.formats import audioop
from tests.integration.conftest import configured_gateway, gateway_idle, wait_for
from tests.integration.test_chat_tools import WEATHER_SCHEMA
from tests.integration.test_realtime_protocol import Client, b64
from tests.realtime_schemas import check_server_events
from tests.speech import RATE, pieces, silence_pcm16, speech_pcm16

API_KEY = "schemas-test-key"
# The chat tests' tool: its arguments are short whatever the random tiny model writes.
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Today's weather.",
    "parameters": WEATHER_SCHEMA,
}
# `high` (a 400 ms silence window) ends the first turn soon; `low` (1.5 s) lets the interruption
# of the barge-in run without ending as a turn of its own.
EAGER = {"type": "semantic_vad", "eagerness": "high", "interrupt_response": True}
PATIENT = {"type": "semantic_vad", "eagerness": "low"}


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    with configured_gateway(stages, tmp_path_factory.mktemp("realtime-schemas"), {"api_key": API_KEY}) as gw:
        yield gw


def connect(gateway, beta: bool):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    if beta:
        headers["OpenAI-Beta"] = "realtime=v1"
    url = f"ws://127.0.0.1:{gateway.http_port}/v1/realtime?model=omnistream"
    return websockets.connect(url, additional_headers=headers, max_size=None)


def session_update(beta: bool, **fields) -> dict:
    """A session.update in the connection's scheme: `turn_detection`, `voice` and `modalities` go
    where that scheme has them."""
    session = dict(fields)
    detection, voice = session.pop("turn_detection", ...), session.pop("voice", None)
    if beta:
        if detection is not ...:
            session["turn_detection"] = detection
        if voice is not None:
            session["voice"] = voice
        return {"type": "session.update", "session": session}
    audio: dict = {}
    if detection is not ...:
        audio["input"] = {"turn_detection": detection}
    if voice is not None:
        audio["output"] = {"voice": voice}
    return {"type": "session.update", "session": {"type": "realtime", **session, "audio": audio}}


async def speak(c: Client, text: str, trailing_silence: float = 0.8) -> None:
    """Speech then silence in 20 ms appends, paced at real time like a microphone."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, piece in enumerate(
        pieces(silence_pcm16(0.2) + speech_pcm16(text) + silence_pcm16(trailing_silence))
    ):
        await c.send({"type": "input_audio_buffer.append", "audio": b64(piece)})
        delay = start + (i + 1) * 0.02 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


async def spoken_turn_and_barge_in(c: Client, beta: bool) -> str:
    """A turn the VAD finds and the model answers aloud; then an answer cut by the user's speech.
    Returns the cut answer's item id."""
    speaker = asyncio.create_task(speak(c, "Can you tell me what time it is"))
    try:
        done = await c.until("response.done")
    finally:
        await speaker
    assert done["response"]["status"] in ("completed", "incomplete"), done["response"]
    audio = "response.audio.delta" if beta else "response.output_audio.delta"
    assert audio in {e["type"] for e in c.seen}
    long_answers = {"ignore_eos": True, "seed": 2}
    await c.send(
        session_update(beta, turn_detection=PATIENT, max_output_tokens=1000, omnistream=long_answers)
    )
    await c.until("session.updated")
    speaker = asyncio.create_task(speak(c, "Please tell me a very long story.", trailing_silence=1.8))
    await c.until(audio)
    await speaker
    interrupt = asyncio.create_task(speak(c, "Stop, stop please.", trailing_silence=0))
    try:
        await c.until("input_audio_buffer.speech_started")
        done = await c.until("response.done")
    finally:
        interrupt.cancel()
    assert done["response"]["status"] == "cancelled", done["response"]
    assert done["response"]["status_details"]["reason"] == "turn_detected"
    cut = done["response"]["output"][0]["id"]
    assert [e for e in c.seen if e["type"] == "conversation.item.truncated" and e["item_id"] == cut]
    # Push to talk from here: the interruption is not a turn of its own.
    await c.send(session_update(beta, turn_detection=None, max_output_tokens=8, omnistream={"seed": 2}))
    await c.until("session.updated")
    await c.send({"type": "input_audio_buffer.clear"})
    await c.until("input_audio_buffer.cleared")
    return cut


async def tool_round_trip(c: Client) -> None:
    await c.send({"type": "session.update", "session": {"tool_choice": "required"}})
    await c.until("session.updated")
    await c.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                  "content": [{"type": "input_text", "text": "Weather in Paris?"}]}})  # fmt: skip
    await c.send({"type": "response.create", "response": {"max_output_tokens": 200}})
    done = await c.until("response.done")
    output = done["response"]["output"]
    assert output and all(item["type"] == "function_call" for item in output), done["response"]
    # `required` may make several calls (parallel_tool_calls): a result each; the last may be cut at
    # max_output_tokens (listed incomplete, no longer in the conversation: no result for it).
    calls = [item for item in output if item["status"] == "completed"]
    assert calls and output[: len(calls)] == calls and len(output) - len(calls) <= 1, output
    for call in calls:
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "clear"}'}
        await c.send({"type": "conversation.item.create", "item": output})
    await c.send({"type": "response.create", "response": {"tool_choice": "auto", "max_output_tokens": 6}})
    done = await c.until("response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done["response"]


async def errors(c: Client, beta: bool, cut: str) -> None:
    """Truncate and delete the cut answer; then errors, each naming what it refuses."""
    await c.send(
        {"type": "conversation.item.truncate", "item_id": cut, "content_index": 0, "audio_end_ms": 0}
    )
    await c.until("conversation.item.truncated")
    await c.send({"type": "conversation.item.truncate", "event_id": "far", "item_id": cut,
                  "content_index": 0, "audio_end_ms": 10**7})  # fmt: skip
    assert (await c.error())["param"] == "audio_end_ms"
    await c.send({"type": "conversation.item.delete", "item_id": cut})
    assert (await c.until("conversation.item.deleted"))["item_id"] == cut
    await c.send({"type": "response.cancel", "event_id": "none-active"})
    assert (await c.error())["code"] == "response_cancel_not_active"
    await c.send({"type": "no.such.event", "event_id": "u"})
    assert (await c.error())["code"] == "unknown_event"
    bad = session_update(beta, voice="nobody", instructions="Still here.")
    await c.send({**bad, "event_id": "v"})
    error = await c.error()
    assert error["event_id"] == "v" and "voice" in error["param"]
    assert (await c.until("session.updated"))["session"]["instructions"] == "Still here."
    await c.send({"type": "session.update", "session": {"tools": []}})
    await c.until("session.updated")
    await c.send({"type": "response.create", "event_id": "r", "response": {"tool_choice": "required"}})
    error = await c.error()
    assert error["event_id"] == "r" and error["param"] == "response.tool_choice"


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_every_server_event_validates_against_the_published_schemas(gateway, stages, beta):
    async def run() -> Client:
        async with connect(gateway, beta) as ws:
            c = Client(ws)
            assert (await c.next())["type"] == "session.created"
            # As the Agents SDK sets a session up: semantic_vad, voice ash, its tools and instructions.
            setup = session_update(
                beta,
                instructions="You are a helpful assistant.",
                turn_detection=EAGER,
                voice="ash",
                tools=[WEATHER],
                tool_choice="auto",
                max_output_tokens=8,
                omnistream={"seed": 1, "max_audio_frames": 20},
            )
            await c.send(setup)
            updated = await c.until("session.updated")
            assert not [e for e in c.seen if e["type"] == "error"], c.seen
            session = updated["session"]
            detection = session["turn_detection"] if beta else session["audio"]["input"]["turn_detection"]
            assert detection["type"] == "semantic_vad" and session["omnistream"]["voice"] == "ethan"
            cut = await spoken_turn_and_barge_in(c, beta)
            await tool_round_trip(c)
            await errors(c, beta, cut)
            return c

    c = asyncio.run(run())
    assert check_server_events(c.seen, beta) == []
    kinds = {e["type"] for e in c.seen}
    assert {"response.content_part.added", "response.function_call_arguments.done", "error"} <= kinds
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))


def test_an_agents_sdk_session_gets_no_error(gateway, stages):
    """Issue 58 as it was met: the Agents SDK's RealtimeRunner, with only the URL and key changed.
    Its first session.update (semantic_vad, voice ash, the agent's tool and instructions) is applied
    whole, and it parses every server event (it logs `Failed to validate server event` and emits an
    error event for one it cannot)."""
    pytest.importorskip("agents")
    from agents import function_tool, set_tracing_disabled
    from agents.realtime import RealtimeAgent, RealtimeRunner

    set_tracing_disabled(True)

    @function_tool
    def get_weather(city: str) -> str:
        """Today's weather in a city."""
        return "sunny"

    async def run() -> tuple[list, list[dict]]:
        agent = RealtimeAgent(name="Assistant", instructions="Be brief.", tools=[get_weather])
        settings = {"output_modalities": ["text"], "max_output_tokens": 8}  # text: quick on the CPU
        runner = RealtimeRunner(agent, config={"model_settings": settings})
        url = f"ws://127.0.0.1:{gateway.http_port}/v1/realtime?model=omnistream"
        seen: list = []
        raw: list[dict] = []
        async with await runner.run(model_config={"url": url, "api_key": API_KEY}) as session:
            await session.send_message("What is the weather in Paris?")
            async with asyncio.timeout(120):
                async for event in session:
                    seen.append(event)
                    if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                        raw.append(event.data.data)
                    if event.type == "agent_end":
                        break
        return seen, raw

    seen, raw = asyncio.run(run())
    assert not [e for e in seen if e.type == "error"], [e.error for e in seen if e.type == "error"]
    updated = [e["session"] for e in raw if e["type"] == "session.updated"]
    assert updated and updated[-1]["instructions"] == "Be brief."
    assert [t["name"] for t in updated[-1]["tools"]] == ["get_weather"]
    assert updated[-1]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert updated[-1]["audio"]["output"]["voice"] == "ash"
    assert check_server_events(raw, beta=False) == []
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))


def mulaw_8khz(pcm16_24khz: bytes) -> bytes:
    """A recording as a telephone bridge sends it: mu-law at 8 kHz."""
    pcm_8khz, _ = audioop.ratecv(pcm16_24khz, 2, 1, RATE, 8000, None)
    return audioop.lin2ulaw(pcm_8khz, 2)


def test_a_telephone_session_g711_a_retrieve_and_an_out_of_band_answer(gateway, stages):
    """Issue 58's telephone bridge (GA): a spoken turn in mu-law 8 kHz found by the VAD and answered
    in mu-law 8 kHz (whole bytes, as long as the gateway counts: truncating at their end is taken,
    a millisecond past it is not), the answer retrieved, and an out-of-band answer that leaves the
    conversation as it was; every event validates."""

    async def run() -> Client:
        async with connect(gateway, beta=False) as ws:
            c = Client(ws)
            assert (await c.next())["type"] == "session.created"
            g711 = {"type": "audio/pcmu"}
            detection = {"type": "server_vad", "silence_duration_ms": 400}
            session = {
                "type": "realtime",
                "audio": {"input": {"format": g711, "turn_detection": detection}, "output": {"format": g711}},
                "max_output_tokens": 8,
                "omnistream": {"seed": 1, "max_audio_frames": 20},
            }
            await c.send({"type": "session.update", "session": session})
            audio = (await c.until("session.updated"))["session"]["audio"]
            assert audio["input"]["format"] == audio["output"]["format"] == g711
            spoken = mulaw_8khz(silence_pcm16(0.2) + speech_pcm16("What time is it") + silence_pcm16(0.8))
            loop = asyncio.get_running_loop()
            start = loop.time()
            for i in range(0, len(spoken), 160):  # 20 ms appends at real time
                await c.send({"type": "input_audio_buffer.append", "audio": b64(spoken[i : i + 160])})
                await asyncio.sleep(max(0.0, start + (i // 160 + 1) * 0.02 - loop.time()))
            done = (await c.until("response.done"))["response"]
            assert done["status"] in ("completed", "incomplete"), done
            answer = done["output"][0]["id"]
            deltas = [
                base64.b64decode(e["delta"]) for e in c.seen if e["type"] == "response.output_audio.delta"
            ]
            assert deltas and all(deltas)
            sent = b"".join(deltas)
            assert len(audioop.ulaw2lin(sent, 2)) == 2 * len(sent)  # one byte a sample
            # At most max_audio_frames' 20 codec frames of 80 ms at 8 kHz (pcm16 24 kHz would be 6x).
            assert 0 < len(sent) <= 20 * 640
            ms = len(sent) // 8  # 8 kHz: 8 bytes a millisecond
            await c.send({"type": "conversation.item.truncate", "item_id": answer, "content_index": 0,
                          "audio_end_ms": ms + 1})  # fmt: skip
            assert (await c.error())["param"] == "audio_end_ms"
            await c.send({"type": "conversation.item.truncate", "item_id": answer, "content_index": 0,
                          "audio_end_ms": ms})  # fmt: skip
            assert (await c.until("conversation.item.truncated"))["audio_end_ms"] == ms
            await c.send({"type": "conversation.item.retrieve", "item_id": answer})
            assert (await c.until("conversation.item.retrieved"))["item"]["id"] == answer
            # Out of band: its own input, its metadata back, nothing added to the conversation.
            user = next(e["item"]["id"] for e in c.seen if e["type"] == "conversation.item.added")
            ask = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Sum up."}]}
            await c.send({"type": "response.create", "response": {
                "conversation": "none", "output_modalities": ["text"], "metadata": {"purpose": "summary"},
                "input": [{"type": "item_reference", "id": user}, ask]}})  # fmt: skip
            created = len(c.seen)
            side = (await c.until("response.done"))["response"]
            assert side["metadata"] == {"purpose": "summary"} and side["conversation_id"] is None
            assert not [e for e in c.seen[created:] if e["type"].startswith("conversation.")]
            await c.send({"type": "conversation.item.retrieve", "item_id": side["output"][0]["id"]})
            assert (await c.error())["code"] == "item_not_found"
            return c

    c = asyncio.run(run())
    assert check_server_events(c.seen, beta=False) == []
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))
