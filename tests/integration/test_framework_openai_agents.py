"""Issue 58 item 5 (Python): the OpenAI Agents SDK (`agents.realtime`: RealtimeAgent, RealtimeRunner),
unmodified and with its defaults, against the real services. Its default session is what a voice
agent sends: audio out, semantic_vad, voice `ash`, input transcription (`gpt-4o-mini-transcribe`),
its agent's instructions and tools; only `model_config`'s URL and key point it here (and, for the
tool round trip, `tool_choice: "required"`: a random checkpoint never picks a tool on `auto`).

A user speaks (espeak-ng speech sent through `session.send_audio` at real time in 20 ms pieces, as a
microphone would), the VAD ends the turn, and the SDK must get what it gets from OpenAI: the answer's
audio and transcript, the user's words transcribed into its history, the tool called and the answer
after its result, and not one `error` event (the SDK emits one for any server event it fails to
validate, and logs `Failed to validate server event`). Every raw server event is checked against the
published schemas too (tests/realtime_schemas.py). The SDK's tracing is off: nothing leaves the host.

The stages are the ending tiny checkpoint's (`ending_stages`, as `make run` serves): the SDK leaves
`max_output_tokens` at its default, `inf` (the gateway's default, 256 tokens and 2,048 codec frames),
and the never-ending checkpoint's answers run to those limits (164 s of audio, minutes on a CPU),
where a real model's, and the ending checkpoint's, end after a sentence. The gateway's `seed` setting
makes its sampled answers repeat (tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any, Literal

import pytest
from agents import function_tool, set_tracing_disabled
from agents.realtime import RealtimeAgent, RealtimeRunner, RealtimeSession

from omnistream.cli.launcher import ServiceProcess
from tests.integration.conftest import REPEATABLE_ANSWERS, configured_gateway, gateway_idle, wait_for
from tests.realtime_schemas import check_server_events
from tests.speech import pieces, silence_pcm16, speech_pcm16

API_KEY = "agents-sdk-test-key"
PHASE = 120.0  # seconds a phase may take: responses of the tiny model on a shared 2-core CPU
INSTRUCTIONS = "You are a brief weather assistant."
QUESTION = "What is the weather in Paris?"
# semantic_vad's default eagerness (auto) is served as an 800 ms silence window: 1.5 s ends the turn.
TRAILING_SILENCE = 1.5


@pytest.fixture(scope="module")
def gateway(ending_stages: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    """The module's own gateway with an API key, as a deployment the SDK reaches would have."""
    config = {"api_key": API_KEY, **REPEATABLE_ANSWERS}
    with configured_gateway(ending_stages, tmp_path_factory.mktemp("agents-sdk"), config) as gw:
        yield gw


@pytest.fixture(autouse=True)
def no_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing may leave the machine: the SDK's default trace exporter posts to OpenAI."""
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    set_tracing_disabled(True)


weather_calls: list[str] = []


@function_tool
def get_weather(city: Literal["Paris", "Rome", "Oslo"]) -> str:
    """Today's weather in a city. An enum, not a free string: the thinker's grammar holds the tiny
    model's random arguments to the schema, and a free string would run to max_output_tokens."""
    weather_calls.append(city)
    return f"Sunny in {city}."


class Recorder:
    """Every SDK event of a session, read in the background (the raw server events apart), so a
    test can wait for a condition while it is still speaking."""

    def __init__(self, session: RealtimeSession) -> None:
        self.events: list[Any] = []
        self.raw: list[dict] = []
        self._task = asyncio.create_task(self._read(session))

    async def _read(self, session: RealtimeSession) -> None:
        async for event in session:
            self.events.append(event)
            if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                self.raw.append(event.data.data)

    def of(self, kind: str) -> list[Any]:
        return [e for e in self.events if e.type == kind]

    def raw_of(self, kind: str) -> list[dict]:
        return [e for e in self.raw if e["type"] == kind]

    async def until(self, done: Callable[[], Any], what: str, timeout: float = PHASE) -> None:
        """Wait for `done()`; fail on the timeout, or at once if the SDK's iterator stopped (it
        raises there what went wrong, e.g. a server event it could not parse at all)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            if self._task.done():
                self._task.result()
                raise AssertionError(f"the session ended before {what}")
            if loop.time() > deadline:
                raise AssertionError(f"no {what} in {timeout} s: {[e['type'] for e in self.raw]}")
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    def history(self) -> list[Any]:
        """The SDK's history as an app following `history_updated` / `history_added` holds it."""
        items: dict[str, Any] = {}
        for event in self.events:
            if event.type == "history_updated":
                items = {item.item_id: item for item in event.history}
            elif event.type == "history_added":
                items[event.item.item_id] = event.item
        return list(items.values())

    def user_transcript(self) -> str | None:
        """The transcript of the user's spoken item in the SDK's history, once it has one."""
        for item in self.history():
            if item.type == "message" and item.role == "user":
                for part in item.content:
                    if part.type == "input_audio" and part.transcript is not None:
                        return part.transcript
        return None


async def speak(session: RealtimeSession, text: str) -> None:
    """`text` spoken, then silence, through the SDK in 20 ms pieces at real time, like a microphone."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    audio = silence_pcm16(0.2) + speech_pcm16(text) + silence_pcm16(TRAILING_SILENCE)
    for i, piece in enumerate(pieces(audio)):
        await session.send_audio(piece)
        await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - loop.time()))


def spoken_session(
    gateway: ServiceProcess, settings: dict, *phases: tuple[Callable[[Recorder], Any], str]
) -> Recorder:
    """An agent with the tool, run by RealtimeRunner with `settings` as its model settings: the
    question spoken, then each phase's condition waited for in turn; the session closed after."""
    agent = RealtimeAgent(name="Assistant", instructions=INSTRUCTIONS, tools=[get_weather])
    runner = RealtimeRunner(agent, config={"model_settings": settings} if settings else None)
    url = f"ws://127.0.0.1:{gateway.http_port}/v1/realtime"

    async def run() -> Recorder:
        async with await runner.run(model_config={"url": url, "api_key": API_KEY}) as session:
            recorder = Recorder(session)
            try:
                await recorder.until(lambda: recorder.raw_of("session.updated"), "session.updated")
                await speak(session, QUESTION)
                for done, what in phases:
                    await recorder.until(lambda done=done: done(recorder), what)
            finally:
                await recorder.stop()
        return recorder

    return asyncio.run(run())


def assert_no_error(recorder: Recorder, caplog: pytest.LogCaptureFixture) -> None:
    """Not one `error` event, nothing the SDK logged as an error, every raw event valid."""
    assert not recorder.of("error"), [e.error for e in recorder.of("error")]
    logged = [r for r in caplog.records if r.name.startswith("openai.agents") and r.levelno >= logging.ERROR]
    assert not logged, [r.getMessage() for r in logged]
    assert check_server_events(recorder.raw, beta=False) == []


def assert_session_applied(recorder: Recorder) -> dict:
    """The SDK's session.update as `session.updated` reports it: the agent's instructions and tool,
    and the SDK's defaults (audio out, semantic_vad, voice ash)."""
    updated = recorder.raw_of("session.updated")
    assert updated, [e["type"] for e in recorder.raw]
    session = updated[-1]["session"]
    assert session["instructions"] == INSTRUCTIONS
    assert [(t["name"], t["parameters"]) for t in session["tools"]] == [
        ("get_weather", get_weather.params_json_schema)
    ]
    assert session["output_modalities"] == ["audio"]
    assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    assert session["audio"]["output"]["voice"] == "ash"
    return session


def is_result(event: dict) -> bool:
    """A tool's result as the SDK sends it (conversation.item.create), as the server adds it."""
    return event["type"] == "conversation.item.added" and event["item"]["type"] == "function_call_output"


def after_result(raw: list[dict]) -> dict | None:
    """The response created after the first tool result, once done (`response.done`'s response).
    The SDK sends a result as soon as its call's item is done, before that response ends."""
    results = [i for i, e in enumerate(raw) if is_result(e)]
    if not results:
        return None
    created = next((e["response"]["id"] for e in raw[results[0] :] if e["type"] == "response.created"), None)
    return next(
        (e["response"] for e in raw if e["type"] == "response.done" and e["response"]["id"] == created), None
    )


def test_a_spoken_turn_with_the_sdk_defaults(
    gateway: ServiceProcess, ending_stages: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """A spoken question, the SDK's defaults: the VAD ends the turn, the answer comes as audio with
    its transcript, the user's words come back transcribed into the SDK's history; no error."""
    caplog.set_level(logging.WARNING, logger="openai.agents")
    recorder = spoken_session(
        gateway,
        {},
        (lambda r: r.of("agent_end"), "answer"),
        # The input's transcription may come after the answer, as OpenAI's does.
        (lambda r: r.user_transcript() is not None, "user transcript in the SDK's history"),
    )
    assert_no_error(recorder, caplog)
    assert_session_applied(recorder)
    kinds = [e["type"] for e in recorder.raw]
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                 "input_audio_buffer.committed", "response.done"):  # fmt: skip
        assert kind in kinds, kinds
    # The answer: audio the SDK decoded, and its transcript in the SDK's history.
    audio = [e.audio.data for e in recorder.of("audio")]
    assert audio and all(audio) and recorder.of("audio_end")
    said = recorder.raw_of("response.output_audio_transcript.done")
    assert said and said[-1]["transcript"]
    answers = [
        part.transcript
        for item in recorder.history()
        if item.type == "message" and item.role == "assistant"
        for part in item.content
        if part.type == "audio"
    ]
    assert answers == [said[-1]["transcript"]], answers
    # The user's words, transcribed by the server, as the SDK keeps them.
    completed = recorder.raw_of("conversation.item.input_audio_transcription.completed")
    assert completed and recorder.user_transcript() == completed[-1]["transcript"]
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, ending_stages), 10))


def test_a_tool_round_trip(
    gateway: ServiceProcess, ending_stages: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """A spoken question with `tool_choice: "required"`: the model calls the agent's tool, the SDK
    runs it (tool_start, tool_end), sends its result and asks for a response, and that response
    comes. `required` still holds for it, so it may call the tool again (OpenAI's semantics; the SDK
    would go on answering): the session ends after it."""
    caplog.set_level(logging.WARNING, logger="openai.agents")
    weather_calls.clear()
    recorder = spoken_session(
        gateway,
        {"tool_choice": "required"},
        (lambda r: after_result(r.raw), "response after the tool's result"),
    )
    assert_no_error(recorder, caplog)
    assert assert_session_applied(recorder)["tool_choice"] == "required"
    # The call, as the model made it and the SDK ran it.
    first = recorder.raw_of("response.done")[0]["response"]
    calls = [i for i in first["output"] if i["type"] == "function_call" and i["status"] == "completed"]
    assert calls and calls[0]["name"] == "get_weather", first
    starts, ends = recorder.of("tool_start"), recorder.of("tool_end")
    assert starts and ends and starts[0].tool.name == ends[0].tool.name == "get_weather"
    assert ends[0].arguments == calls[0]["arguments"]
    assert weather_calls and ends[0].output == f"Sunny in {weather_calls[0]}."
    # Its result as the SDK sent it, then the response the SDK asked for after it.
    output = next(e["item"] for e in recorder.raw if is_result(e))
    assert output["call_id"] == calls[0]["call_id"] and output["output"] == ends[0].output
    done = after_result(recorder.raw)
    assert done is not None and done["id"] != first["id"], done
    # `required` may make several calls: a random checkpoint may go on calling to max_output_tokens.
    assert done["status"] == "completed" or done["status_details"]["reason"] == "max_output_tokens", done
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, ending_stages), 10))
