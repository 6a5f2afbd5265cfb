"""Issue 58: pipecat (pipecat-ai 1.14.0) and its OpenAI Realtime service (OpenAIRealtimeLLMService),
unmodified, against the real stack: its default settings, the base URL and the API key, run headless
(tests/frameworks/pipecat_turn.py, in .venv-pipecat: pipecat pins protobuf<7, this project >=7.35).

* A spoken turn (espeak-ng, paced at real time, ended by the server's VAD): the context's system
  message and tools are the session's as session.updated shows them, pipecat makes audio and the
  answer's transcript out of the answer, and the user's transcript reaches its TranscriptionFrame
  and its context (the one setting added: `audio.input.transcription`, off by default in OpenAI's
  API as here).
* A function call round trip with only `tool_choice: "required"` added (a random checkpoint never
  picks a tool on `auto`; pipecat sends it before its tools): the registered function is called,
  pipecat sends its result, and a response follows it.

pipecat treats any server `error` event as fatal (its receive loop ends), so not one may come. The
gateway caps a response's audio at 20 codec frames (its deployment setting, not pipecat's): the
tiny model's answers run to their limits, and 2048 frames would take minutes on a shared CPU. Its
`seed` setting makes the sampled answers repeat (tests/integration/conftest.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.integration.conftest import REPEATABLE_ANSWERS, configured_gateway, gateway_idle, wait_for
from tests.speech import silence_pcm16, speech_pcm16

ROOT = Path(__file__).resolve().parents[2]
PIPECAT_PY = ROOT / ".venv-pipecat" / "bin" / "python"
DRIVER = ROOT / "tests" / "frameworks" / "pipecat_turn.py"
API_KEY = "pipecat-test-key"
INSTRUCTIONS = "You are a weather assistant. Answer in one short sentence."  # the driver's
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    config = {"api_key": API_KEY, "max_audio_frames": 20, **REPEATABLE_ANSWERS}
    with configured_gateway(stages, tmp_path_factory.mktemp("framework-pipecat"), config) as gw:
        yield gw


@dataclass
class Run:
    """What the driver saw, in order (its JSON lines), and its log for a failure's message."""

    lines: list[dict]
    log: str

    def of(self, kind: str) -> list[dict]:
        return [line for line in self.lines if line["kind"] == kind]

    def server(self, kind: str | None = None) -> list[dict]:
        return [e["event"] for e in self.of("server") if kind is None or e["event"]["type"] == kind]

    def client(self, kind: str) -> list[dict]:
        return [e["event"] for e in self.of("client") if e["event"]["type"] == kind]

    def frames(self, name: str) -> list[dict]:
        return [f for f in self.of("frame") if f["frame"] == name]

    def index(self, predicate: Callable[[dict], bool]) -> int:
        return next(i for i, line in enumerate(self.lines) if predicate(line))


def run_driver(gateway, scenario: str, *extra: str) -> Run:
    if not PIPECAT_PY.exists():
        pytest.fail(f"no {PIPECAT_PY.parent.parent.name}: `make setup-pipecat` builds it (make test does)")
    # A bare environment: no key or proxy of the user's reaches pipecat (and it reaches no network:
    # the driver refuses any connection off the loopback interface and reports it).
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    url = f"ws://127.0.0.1:{gateway.http_port}/v1/realtime"
    args = [str(PIPECAT_PY), str(DRIVER), "--url", url, "--api-key", API_KEY, "--scenario", scenario]
    done = subprocess.run([*args, *extra], capture_output=True, text=True, env=env, timeout=420)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    run = Run(lines, done.stderr[-6000:])
    assert run.of("pipecat") == [{"kind": "pipecat", "version": "1.14.0"}], run.log
    assert not run.of("network"), run.of("network")
    # Zero error events: pipecat ends its session at the first (services/openai/realtime/llm.py,
    # _receive_task_handler), and every event pipecat models parses with its models.
    assert not run.server("error"), run.server("error")
    assert not run.of("unparsed"), run.of("unparsed")
    assert not run.frames("ErrorFrame"), run.frames("ErrorFrame")
    assert done.returncode == 0 and run.of("done")[-1]["ok"], (run.of("done"), run.log)
    return run


def applied_session(run: Run) -> dict:
    """The session as the server last reported it: after pipecat's conversation set-up."""
    updated = run.server("session.updated")
    assert len(updated) >= 2, updated  # its first update (on session.created), then the context's
    session = updated[-1]["session"]
    assert session["instructions"] == INSTRUCTIONS
    (tool,) = session["tools"]
    sent = run.client("session.update")[-1]["session"]["tools"]
    assert tool["name"] == "get_weather" and tool["parameters"] == sent[0]["parameters"]
    return session


def test_a_spoken_turn(gateway, stages, tmp_path):
    speech = tmp_path / "speech.pcm"
    # Speech, then 1.6 s of silence: the server VAD (pipecat's default, server_vad) ends the turn.
    speech.write_bytes(silence_pcm16(0.2) + speech_pcm16("What is the weather in Paris") + silence_pcm16(1.6))
    run = run_driver(gateway, "turn", "--speech", str(speech))

    session = applied_session(run)
    assert session["tool_choice"] == "auto"
    assert session["audio"]["input"]["transcription"] is not None
    kinds = [e["type"] for e in run.server()]
    for kind in ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"):
        assert kinds.count(kind) == 1, kinds
    (committed,) = run.server("input_audio_buffer.committed")
    turn_at = run.index(lambda line: line.get("event", {}).get("type") == "input_audio_buffer.committed")

    # The answer to the spoken turn, as pipecat turns it into frames: audio and its transcript.
    done = run.server("response.done")
    assert len(done) == 2, [d["response"]["status"] for d in done]  # the greeting, then the answer
    answer = done[1]["response"]
    assert answer["status"] in ("completed", "incomplete"), answer
    (message,) = answer["output"]
    said = message["content"][0]["transcript"]
    after = run.lines[turn_at:]
    audio = [f for f in after if f.get("frame") == "TTSAudioRawFrame"]
    assert audio and all(f["rate"] == 24000 for f in audio)
    assert sum(f["bytes"] for f in audio) > 0
    words = "".join(f["text"] for f in after if f.get("frame") == "TTSTextFrame")
    assert said and words == said

    # The user's transcript (server-side input transcription): pipecat's TranscriptionFrame, and
    # the user message it writes into its context.
    transcribed = run.server(TRANSCRIBED)
    assert [t["item_id"] for t in transcribed] == [committed["item_id"]], kinds
    text = transcribed[0]["transcript"]
    assert text.strip()
    assert [f["text"] for f in run.frames("TranscriptionFrame")] == [text]
    assert [m["content"] for m in run.of("user_message")] == [text.strip()]
    (context,) = run.of("context")
    assert {"role": "user", "content": text.strip()} in context["messages"]
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))


def test_a_function_call_round_trip(gateway, stages):
    run = run_driver(gateway, "tool")

    session = applied_session(run)
    assert session["tool_choice"] == "required"
    # pipecat's first session.update sets `required` before any tool (accepted since issue 58).
    first = run.client("session.update")[0]["session"]
    assert first["tool_choice"] == "required" and not first.get("tools")

    # The model's call, pipecat's call of the registered function, its result sent back.
    done = run.server("response.done")  # a third may have started: pipecat answers each call
    assert len(done) >= 2, done
    # `required` may make several calls in a response, the last maybe cut (listed incomplete).
    output = done[0]["response"]["output"]
    calls = [item for item in output if item["type"] == "function_call" and item["status"] == "completed"]
    assert calls and done[0]["response"]["status"] in ("completed", "incomplete"), done[0]["response"]
    call = calls[0]
    assert call["name"] == "get_weather"
    called = {c["call_id"]: c for c in run.of("function_call")}
    assert called[call["call_id"]]["arguments"] == json.loads(call["arguments"])
    outputs = [
        e["item"]
        for e in run.client("conversation.item.create")
        if e["item"]["type"] == "function_call_output"
    ]
    answered = next(o for o in outputs if o["call_id"] == call["call_id"])
    assert json.loads(answered["output"]) == {"sky": "clear", "celsius": 21}
    added = [e["item"] for e in run.server("conversation.item.added")]
    assert any(i["type"] == "function_call_output" and i["call_id"] == call["call_id"] for i in added)

    # A further response after the result, asked for by pipecat (its response.create).
    result_at = run.index(
        lambda line: (
            line["kind"] == "client" and line["event"].get("item", {}).get("call_id") == call["call_id"]
        )
    )
    creates = [
        i for i, line in enumerate(run.lines) if line.get("event", {}).get("type") == "response.create"
    ]
    assert any(i > result_at for i in creates), creates
    assert done[1]["response"]["status"] in ("completed", "incomplete"), done[1]["response"]
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))
