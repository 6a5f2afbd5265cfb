"""pipecat's OpenAI Realtime service, unmodified, run headless against an omnistream gateway.

Run with .venv-pipecat's python (make setup-pipecat): pipecat-ai pins protobuf<7, which this project's
environment cannot hold, so tests/integration/test_framework_pipecat.py starts the stack and runs this
script as a subprocess. It prints one JSON object a line, one per observation, in the order seen:

* `{"kind": "pipecat", "version": ...}`: first;
* `{"kind": "server", "event": {...}}`: every server event as the websocket received it (an audio
  delta's base64 replaced by its length, `delta_bytes`); `{"kind": "unparsed", ...}` after one that
  pipecat's own event models refuse (its receive loop dies on such an event);
* `{"kind": "client", "event": {...}}`: every client event pipecat sent (an append's audio likewise);
* `{"kind": "frame", ...}`: the frames pipecat produced: its output at the pipeline's end (a sink
  processor: audio, the answer's transcript, function results) and, seen by a pipeline observer,
  what the service pushed upstream (the user's transcription, errors);
* `{"kind": "user_message", "content": ...}`: a user message pipecat wrote into its context;
* `{"kind": "function_call", ...}`: a call of the registered function (its arguments);
* `{"kind": "context", "messages": [...]}`: the context pipecat kept, at the end;
* `{"kind": "network", ...}`: a connection or name lookup off the loopback interface (refused);
* `{"kind": "done", "ok": bool, "reason": str}`: last.

Headless: no transport. The pipeline is [user aggregator, service, sink, assistant aggregator], the
layout of pipecat's examples/realtime/realtime-openai.py less its transport; audio goes in as
InputAudioRawFrame frames queued on the worker in 20 ms pieces at real time, as a microphone's. As in
that example, an LLMRunFrame starts the conversation: only then does the service send the context's
system message (as the session's instructions) and its tools.

pipecat has no hook on the raw server events (its event handlers see conversation items only), so
the websocket is observed: the service module's `websocket_connect` is wrapped, and the connection it
returns has its `recv` and `send` wrapped to record each message and hand it on unchanged. The
service, its class and its settings are pipecat's own: the defaults, plus the base URL and the API
key, plus one session property a scenario needs (`main` says which and why).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import ipaddress
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    FunctionCallResultFrame,
    InputAudioRawFrame,
    InterimTranscriptionFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime import llm as realtime_llm
from pipecat.services.openai.realtime.events import (
    AudioConfiguration,
    AudioInput,
    InputAudioTranscription,
    SessionProperties,
)
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

RATE = 24000
PIECE = RATE * 2 // 50  # 20 ms of pcm16 mono
INSTRUCTIONS = "You are a weather assistant. Answer in one short sentence."
WEATHER = FunctionSchema(
    name="get_weather",
    description="Today's weather in a city.",
    properties={
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "celsius": {"type": "boolean"},
    },
    required=["city", "celsius"],
)
WEATHER_RESULT = {"sky": "clear", "celsius": 21}


def emit(kind: str, **fields: Any) -> None:
    """One observation, one line, flushed: the test reads them in the order they happened."""
    print(json.dumps({"kind": kind, **fields}), flush=True)


def loopback_only() -> None:
    """Nothing may leave the machine: an audit hook refuses (and reports) any connection or name
    lookup off the loopback interface, whichever library would make it."""

    def local(host: object) -> bool:
        if isinstance(host, bytes):
            host = host.decode()
        if host in (None, "", "localhost"):
            return True
        try:
            return ipaddress.ip_address(str(host)).is_loopback
        except ValueError:
            return False

    def hook(event: str, args: tuple) -> None:
        if event == "socket.connect":
            address = args[1]
            if isinstance(address, tuple) and not local(address[0]):  # not a tuple: a Unix socket
                emit("network", event=event, address=repr(address))
                raise ConnectionRefusedError(f"off-machine connection refused: {address!r}")
        elif event == "socket.getaddrinfo" and not local(args[0]):
            emit("network", event=event, address=repr(args[0]))
            raise OSError(f"off-machine name lookup refused: {args[0]!r}")

    sys.addaudithook(hook)


def compact(event: dict) -> dict:
    """An event as recorded: base64 audio replaced by its decoded length, so lines stay short."""
    field = {"response.output_audio.delta": "delta", "input_audio_buffer.append": "audio"}.get(
        event.get("type", "")
    )
    audio = event.get(field) if field else None
    if not isinstance(audio, str):
        return event
    rest = {k: v for k, v in event.items() if k != field}
    return {**rest, "delta_bytes": len(audio) * 3 // 4 - audio[-2:].count("=")}


class Observed:
    """The server events seen so far, and a way to wait for one."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.user_messages = 0  # written into pipecat's context
        self._changed = asyncio.Event()

    def add(self, event: dict) -> None:
        self.events.append(event)
        self._changed.set()

    def user_message(self) -> None:
        self.user_messages += 1
        self._changed.set()

    def count(self, kind: str) -> int:
        return sum(e.get("type") == kind for e in self.events)

    async def until(self, predicate: Callable[[], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()


def observe_websocket(observed: Observed) -> None:
    """Record the service's websocket traffic without changing it (see the module docstring)."""
    connect = realtime_llm.websocket_connect

    async def observed_connect(*args: Any, **kwargs: Any) -> Any:
        connection = await connect(*args, **kwargs)
        recv, send = connection.recv, connection.send

        async def recording_recv(*a: Any, **k: Any) -> Any:
            message = await recv(*a, **k)
            event = json.loads(message)
            emit("server", event=compact(event))
            try:  # what pipecat's receive loop does with it next; only to name a refusal
                events.parse_server_event(message)
            except Exception as exc:
                emit("unparsed", type=event.get("type"), error=str(exc)[:2000])
            observed.add(event)
            return message

        async def recording_send(message: Any, *a: Any, **k: Any) -> Any:
            emit("client", event=compact(json.loads(message)))
            return await send(message, *a, **k)

        connection.recv, connection.send = recording_recv, recording_send
        return connection

    realtime_llm.websocket_connect = observed_connect


def record(frame: Frame, where: str) -> None:
    """The frames a test asserts on, one line each (audio by its length)."""
    if isinstance(frame, TTSAudioRawFrame):
        emit("frame", frame="TTSAudioRawFrame", at=where, bytes=len(frame.audio), rate=frame.sample_rate)
    elif isinstance(frame, TTSTextFrame | TranscriptionFrame | InterimTranscriptionFrame):
        emit("frame", frame=type(frame).__name__, at=where, text=frame.text)
    elif isinstance(frame, ErrorFrame):
        emit("frame", frame="ErrorFrame", at=where, error=str(frame.error), fatal=frame.fatal)
    elif isinstance(frame, FunctionCallResultFrame):
        emit("frame", frame="FunctionCallResultFrame", at=where, result=frame.result)


class Sink(FrameProcessor):
    """The pipeline's output, where a transport's output would take it: records and passes on."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            record(frame, "sink")
        await self.push_frame(frame, direction)


class Upstream(BaseObserver):
    """What the service pushes upstream, where no processor of ours sits: the user aggregator takes
    the user's TranscriptionFrame in, so only an observer sees it as pipecat produced it."""

    def __init__(self, service: FrameProcessor) -> None:
        super().__init__(observe_every_push=False)
        self.service = service

    async def on_push_frame(self, data: FramePushed) -> None:
        if data.source is self.service and data.direction == FrameDirection.UPSTREAM:
            record(data.frame, "upstream")


async def get_weather(params: FunctionCallParams) -> None:
    """The registered function: a fixed forecast, handed back through pipecat's callback."""
    emit("function_call", name=params.function_name, arguments=params.arguments, call_id=params.tool_call_id)
    await params.result_callback(WEATHER_RESULT)


async def scenario(args: argparse.Namespace, worker: PipelineWorker, observed: Observed) -> str:
    """Drive one scenario to its end; returns what ended it."""
    await observed.until(lambda: observed.count("session.updated") >= 1, args.timeout)
    await worker.queue_frames([LLMRunFrame()])
    await observed.until(lambda: observed.count("response.done") >= 1, args.timeout)
    if args.scenario == "tool":
        # The call, pipecat's result (function_call_output), then the response after it; with
        # `required` still set that response may call again, so the scenario stops there.
        await observed.until(lambda: observed.count("response.done") >= 2, args.timeout)
        return "the response after the function's result is done"
    speech = args.speech.read_bytes()
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i in range(0, len(speech), PIECE):
        frame = InputAudioRawFrame(audio=speech[i : i + PIECE], sample_rate=RATE, num_channels=1)
        await worker.queue_frames([frame])
        await asyncio.sleep(max(0.0, start + (i // PIECE + 1) * 0.02 - loop.time()))
    await observed.until(lambda: observed.count("response.done") >= 2, args.timeout)
    # The transcript may come after the answer (OpenAI allows either order): wait for it a while,
    # then end either way, the test says what is missing.
    try:
        await observed.until(
            lambda: observed.count("conversation.item.input_audio_transcription.completed") >= 1,
            args.transcript_wait,
        )
        # pipecat writes the user message into its context one latency window after the answer
        # starts, or at once when its end has come already.
        await observed.until(lambda: observed.user_messages >= 1, args.transcript_wait)
    except TimeoutError:
        pass
    return "the spoken turn's response is done"


async def main(args: argparse.Namespace) -> int:
    emit("pipecat", version=importlib.metadata.version("pipecat-ai"))
    observed = Observed()
    observe_websocket(observed)
    if args.scenario == "tool":
        # The one setting the tool scenario adds: a random checkpoint never picks a tool on `auto`.
        properties = SessionProperties(tool_choice="required")
    else:
        # The one setting the spoken turn adds: the user's transcript is off by default (in OpenAI's
        # API as here); turned on as pipecat's own example does, with its default model's name.
        transcription = AudioInput(transcription=InputAudioTranscription())
        properties = SessionProperties(audio=AudioConfiguration(input=transcription))
    llm = OpenAIRealtimeLLMService(
        api_key=args.api_key,
        base_url=args.url,
        settings=OpenAIRealtimeLLMService.Settings(session_properties=properties),
    )
    llm.register_function("get_weather", get_weather)
    # The instructions as a context's system message, and the tools in the context: what the
    # service sends once the LLMRunFrame starts the conversation. The first message is the one it
    # answers first (the example's "Say hello!"; for the tool, a question that wants it).
    first = "What is the weather in Paris?" if args.scenario == "tool" else "Say hello!"
    messages: list[Any] = [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": first}]
    context = LLMContext(messages, ToolsSchema(standard_tools=[WEATHER]))
    user_aggregator, assistant_aggregator = LLMContextAggregatorPair(context)

    @user_aggregator.event_handler("on_user_turn_message_added")
    async def on_user_turn_message_added(_aggregator: Any, message: Any) -> None:
        emit("user_message", content=message.content)
        observed.user_message()

    pipeline = Pipeline([user_aggregator, llm, Sink(name="sink"), assistant_aggregator])
    worker = PipelineWorker(pipeline, observers=[Upstream(llm)])
    errors: list[str] = []

    @worker.event_handler("on_pipeline_error")
    async def on_pipeline_error(_worker: PipelineWorker, frame: ErrorFrame) -> None:
        errors.append(str(frame.error))

    async def drive() -> tuple[bool, str]:
        try:
            return True, await scenario(args, worker, observed)
        except TimeoutError:
            last = [e.get("type") for e in observed.events][-8:]
            return False, f"timed out; the last server events: {last}"
        finally:
            await worker.cancel(reason="scenario over")

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    driving = asyncio.create_task(drive())
    await runner.run()
    ok, reason = await driving
    emit("context", messages=[m for m in context.get_messages() if isinstance(m, dict)])
    if errors:
        ok, reason = False, f"{reason}; pipeline errors: {errors}"
    emit("done", ok=ok, reason=reason)
    return 0 if ok else 1


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", required=True, help="ws://HOST:PORT/v1/realtime")
    parser.add_argument("--api-key", required=True)
    parser.add_argument("--scenario", choices=("turn", "tool"), required=True)
    parser.add_argument("--speech", type=Path, help="pcm16 24 kHz mono: the `turn` scenario's user")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds each step may take")
    parser.add_argument("--transcript-wait", type=float, default=10.0, help="seconds, after the answer")
    parser.add_argument("--log-level", default="INFO", help="of pipecat's own log (stderr)")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse()
    logger.remove()
    logger.add(sys.stderr, level=arguments.log_level)
    loopback_only()
    sys.exit(asyncio.run(main(arguments)))
