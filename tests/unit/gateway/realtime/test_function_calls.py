"""Realtime function calling: the session's tools (checked, shown back), calls as output items
(streamed arguments, no half call left behind on a cancel), results as items, and both in the
next prompt (gateway/realtime/function_calls.py, tool_config.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.config import GatewayConfig
from gateway.realtime.connection import Connection
from gateway.realtime.conversation import Item
from gateway.realtime.outbound import Outbound
from gateway.realtime.turn import messages_of
from gateway.serving.session import Timings
from omnistream.request.generation import DoneEvent, GenerationRequest, TextEvent
from tests.realtime_schemas import check_server_events

pytestmark = pytest.mark.unit

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class FakeSession:
    """What a response reads of an admitted request: its events, given as text deltas."""

    def __init__(self, deltas: list[str], hold: asyncio.Event | None = None, finish: str = "stop") -> None:
        self.deltas = deltas
        self.hold = hold  # set: the stream ends; unset, it waits after the deltas (a cancel lands)
        self.finish = finish  # the thinker's finish reason ("length": max_output_tokens)
        self.replica_addresses: dict[str, str] = {}
        self.timings = Timings(0.0)
        self.first_chunk_s = None  # no audio planned
        self.closed = False

    async def events(self) -> AsyncIterator[Any]:
        for delta in self.deltas:
            yield TextEvent([1], delta)
        if self.hold is not None:
            await self.hold.wait()
        yield DoneEvent([1, 2], [1] * len(self.deltas), self.finish, 0, 0, None, None, 0.0)

    def listening(self) -> Any:
        return SimpleNamespace(heard=False)

    async def aclose(self) -> None:
        self.closed = True


class FakeCore:
    def __init__(self) -> None:
        self.config = GatewayConfig()
        self.deployment = SimpleNamespace(
            model_id="m",
            voices=["ethan"],
            default_voice="ethan",
            input_modalities=("text",),
            max_model_len=4096,
        )
        self.media = SimpleNamespace(decode=self._decode)
        self.replicas = SimpleNamespace(release_cache_soon=lambda scope: None)
        self.requests: list[GenerationRequest] = []
        self.answers: list[FakeSession] = []

    async def _decode(self, messages: Any, use_audio_in_video: bool) -> None:
        return None

    async def open(self, request: GenerationRequest, trace: Any = None) -> FakeSession:
        self.requests.append(request)
        return self.answers.pop(0)


def _connection() -> tuple[Connection, FakeCore, list[dict]]:
    queued: list[dict] = []

    async def put(event: dict | None, owner: Any = None, samples: int = 0) -> None:
        if event is not None:
            queued.append(event)

    outbound = Outbound(lambda text: asyncio.sleep(0))
    outbound.put = put  # type: ignore[method-assign]
    core = FakeCore()
    return Connection(core, outbound, beta=False, model=None), core, queued  # type: ignore[arg-type]


async def _send(conn: Connection, **event: Any) -> None:
    await conn.handle_text(json.dumps(event))


async def _ask(conn: Connection, text: str = "What is the weather in Paris?") -> None:
    content = [{"type": "input_text", "text": text}]
    await _send(conn, type="conversation.item.create", item={"role": "user", "content": content})


async def _respond(conn: Connection, modality: str = "text") -> None:
    await _send(conn, type="response.create", response={"output_modalities": [modality]})
    assert conn.response is not None
    await conn.response.wait()


def _kinds(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


def _since(events: list[dict], kind: str) -> list[dict]:
    start = max(i for i, e in enumerate(events) if e["type"] == kind)
    return events[start:]


def test_session_tools_are_shown_back_and_bad_ones_refused_naming_the_param():
    async def run() -> tuple[Connection, list[dict]]:
        conn, _, queued = _connection()
        await _send(conn, type="session.update", session={"tools": [WEATHER], "tool_choice": "required"})
        bad = {**WEATHER, "name": "other", "parameters": {"type": "no such type"}}
        await _send(
            conn, type="session.update", event_id="e1", session={"tools": [WEATHER, bad], "instructions": "x"}
        )
        return conn, queued

    conn, queued = asyncio.run(run())
    updated, error, again = queued
    assert updated["type"] == "session.updated"
    assert updated["session"]["tools"] == [WEATHER] and updated["session"]["tool_choice"] == "required"
    assert error["type"] == "error" and error["error"]["event_id"] == "e1"
    assert error["error"]["param"] == "session.tools.1.parameters"
    # The bad tools were refused alone: the tools stay as they were, the instructions applied.
    assert again["type"] == "session.updated" and again["session"]["tools"] == [WEATHER]
    assert again["session"]["instructions"] == "x"
    assert [f.name for f in conn.config.tools] == ["get_weather"] and conn.config.tool_choice == "required"


def test_a_choice_is_taken_before_its_tools_and_checked_when_a_response_runs():
    """Issue 58: pipecat sends `tool_choice: "required"` before its tools; it was refused (and
    pipecat takes any error as fatal). Now it is set, and a response that would run with a choice
    its tools cannot meet is refused alone, naming where the choice was set."""

    async def run() -> tuple[Connection, FakeCore, list[dict]]:
        conn, core, queued = _connection()
        await _send(conn, type="session.update", event_id="e1", session={"tool_choice": "required"})
        await _ask(conn)
        await _send(conn, type="response.create", event_id="r1")
        named = {"tool_choice": {"type": "function", "name": "x"}, "tools": [WEATHER]}
        await _send(conn, type="response.create", event_id="r2", response=named)
        await _send(conn, type="session.update", session={"tools": [WEATHER]})
        core.answers.append(FakeSession([CALL]))
        await _send(conn, type="response.create")
        assert conn.response is not None
        await conn.response.wait()
        return conn, core, queued

    conn, core, queued = asyncio.run(run())
    assert queued[0]["type"] == "session.updated" and queued[0]["session"]["tool_choice"] == "required"
    errors = [e["error"] for e in queued if e["type"] == "error"]
    assert [(e["event_id"], e["param"]) for e in errors] == [
        ("r1", "session.tool_choice"),
        ("r2", "response.tool_choice"),
    ]
    assert "needs tools" in errors[0]["message"] and "'x'" in errors[1]["message"]
    # Neither started: no item was left behind, and the stages saw only the one that ran.
    assert len(core.requests) == 1 and core.requests[0].structured_output is not None  # enforced
    done = queued[-1]
    assert done["type"] == "response.done" and done["response"]["output"][0]["type"] == "function_call"
    assert [i.role for i in conn.conversation.items.values()] == ["user", "assistant"]


def test_a_call_is_an_output_item_of_its_own_and_the_words_are_the_message():
    async def run() -> tuple[Connection, FakeCore, list[dict]]:
        conn, core, queued = _connection()
        await _send(conn, type="session.update", session={"tools": [WEATHER]})
        await _ask(conn)
        pieces = [
            "Let me ",
            "look. <tool",
            "_call>\n",
            '{"name": "get_weather", "arguments": ',
            '{"city": "Paris"}}\n</tool_call>',
        ]
        core.answers.append(FakeSession(pieces))
        await _respond(conn)
        return conn, core, queued

    conn, core, queued = asyncio.run(run())
    request = core.requests[0]
    assert request.tools == [
        {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    ]
    assert request.structured_output is None  # auto: parsed, not enforced
    events = _since(queued, "response.created")
    kinds = _kinds(events)
    assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == "Let me look."
    call_added = next(
        e
        for e in events
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"
    )
    assert call_added["output_index"] == 1 and call_added["item"]["name"] == "get_weather"
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert (
        json.loads(done["arguments"]) == {"city": "Paris"}
        and done["call_id"] == call_added["item"]["call_id"]
    )
    assert kinds.index("response.function_call_arguments.done") < kinds.index("response.done")
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 2
    response = events[-1]["response"]
    assert [o["type"] for o in response["output"]] == ["message", "function_call"]
    assert response["output"][1]["status"] == "completed" and response["status"] == "completed"
    items = list(conn.conversation.items.values())
    assert [(i.type, i.role) for i in items] == [
        ("message", "user"),
        ("message", "assistant"),
        ("function_call", "assistant"),
    ]


def test_a_required_call_alone_has_no_message_item_and_streams_its_arguments():
    async def run() -> tuple[Connection, FakeCore, list[dict]]:
        conn, core, queued = _connection()
        await _send(conn, type="session.update", session={"tools": [WEATHER], "tool_choice": "required"})
        await _ask(conn)
        pieces = [
            '<tool_call>\n{"name": "get_weather", "arguments": {"ci',
            'ty": "Pa',
            'ris"}',
            "}\n</tool_call>",
        ]
        core.answers.append(FakeSession(pieces))
        await _respond(conn)
        return conn, core, queued

    conn, core, queued = asyncio.run(run())
    assert core.requests[0].structured_output is not None  # enforced by the thinker's grammar
    events = _since(queued, "response.created")
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) > 1 and json.loads("".join(deltas)) == {"city": "Paris"}
    assert all(e.get("item", {}).get("type", "function_call") == "function_call" for e in events[1:-1])
    assert "response.content_part.added" not in _kinds(events)
    output = events[-1]["response"]["output"]
    assert [o["type"] for o in output] == ["function_call"] and output[0]["arguments"] == "".join(deltas)
    assert [i.type for i in conn.conversation.items.values()] == ["message", "function_call"]


@pytest.mark.parametrize("how", ["response.cancel", "barge-in"])
def test_a_cancel_during_the_arguments_leaves_no_half_call(how: str):
    async def run() -> tuple[Connection, list[dict]]:
        conn, core, queued = _connection()
        await _send(conn, type="session.update", session={"tools": [WEATHER], "tool_choice": "required"})
        await _ask(conn)
        hold = asyncio.Event()
        core.answers.append(FakeSession(['<tool_call>\n{"name": "get_weather", "arguments": {"ci'], hold))
        await _send(conn, type="response.create")
        for _ in range(100):  # until the call is under way
            await asyncio.sleep(0)
            if any(e["type"] == "response.function_call_arguments.delta" for e in queued):
                break
        if how == "barge-in":
            await conn.input_audio.speech_started(0)  # the server VAD heard the user: what a barge-in runs
        else:
            await _send(conn, type="response.cancel")
        return conn, queued

    conn, queued = asyncio.run(run())
    events = _since(queued, "response.created")
    kinds = _kinds(events)
    added = next(e for e in events if e["type"] == "response.output_item.added")
    done = next(e for e in events if e["type"] == "response.output_item.done")
    assert done["item"]["id"] == added["item"]["id"] and done["item"]["status"] == "incomplete"
    assert {"type": "conversation.item.deleted", "item_id": added["item"]["id"]}.items() <= next(
        e for e in events if e["type"] == "conversation.item.deleted"
    ).items()
    assert "response.function_call_arguments.done" not in kinds
    response = events[-1]["response"]
    assert kinds[-1] == "response.done" and response["status"] == "cancelled"
    assert response["status_details"]["type"] == "cancelled"
    # The cut call is listed as it was made (issue 59: it was taken back with nothing said of it).
    assert response["output"] == [done["item"]] and done["item"]["arguments"] == '{"ci'
    assert "response.content_part.added" not in kinds  # no message item for an answer of a call
    assert [i.type for i in conn.conversation.items.values()] == ["message"]  # the user's question alone
    assert check_server_events(events, beta=False) == []


CUT_CALL = ['<tool_call>\n{"name": "get_weather", "arguments": {"ci', 'ty": "Pa']


@pytest.mark.parametrize("modality", ["text", "audio"])
def test_a_call_cut_at_max_output_tokens_is_listed_incomplete_and_leaves_the_conversation(modality: str):
    """Issue 59: the cut call was taken back unexplained and an empty message item made instead.
    Now response.done lists it (incomplete, the arguments that were made) and says why; it leaves
    the conversation (`conversation.item.deleted`), so the next prompt holds no half call."""

    async def run() -> tuple[Connection, FakeCore, list[dict]]:
        conn, core, queued = _connection()
        await _send(conn, type="session.update", session={"tools": [WEATHER], "tool_choice": "required"})
        await _ask(conn)
        core.answers.append(FakeSession(CUT_CALL, finish="length"))
        await _respond(conn, modality)
        await _send(conn, type="session.update", session={"tool_choice": "auto"})
        await _ask(conn, "Never mind.")
        core.answers.append(FakeSession(["Fine."]))
        await _respond(conn, modality)
        return conn, core, queued

    conn, core, queued = asyncio.run(run())
    first_done = next(i for i, e in enumerate(queued) if e["type"] == "response.done")
    events = _since(queued[: first_done + 1], "response.created")
    kinds = _kinds(events)
    added = next(e for e in events if e["type"] == "response.output_item.added")["item"]
    assert kinds == [
        "response.created",
        "conversation.item.added",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * kinds.count("response.function_call_arguments.delta"),
        "response.output_item.done",
        "conversation.item.deleted",
        "response.done",
    ]
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert deltas == '{"city": "Pa'
    closed = next(e for e in events if e["type"] == "response.output_item.done")["item"]
    assert closed == {**added, "status": "incomplete", "arguments": deltas}
    assert events[-2]["item_id"] == added["id"]
    response = events[-1]["response"]
    assert response["status"] == "incomplete"
    assert response["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    assert response["output"] == [closed]
    # The next turn: its prompt has the two questions and no call.
    messages = core.requests[1].messages
    assert messages is not None and [m["role"] for m in messages] == ["user", "user"]
    assert not any(m.get("tool_calls") for m in messages)
    assert [i.type for i in conn.conversation.items.values()] == ["message"] * 3
    assert check_server_events(queued, beta=False) == []


@pytest.mark.parametrize("made", [["<tool_ca"], ['<tool_call>\n{"na'], []], ids=["marker", "name", "nothing"])
@pytest.mark.parametrize("modality", ["text", "audio"])
def test_a_forced_call_cut_before_its_name_is_an_empty_incomplete_response(made: list[str], modality: str):
    """Issue 59: cut in its open marker, the answer was a message item with the transcript
    "<tool_ca" (spoken, too); cut later, an empty message item. It is no words: no item at all."""

    async def run() -> tuple[Connection, list[dict]]:
        conn, core, queued = _connection()
        await _send(conn, type="session.update", session={"tools": [WEATHER], "tool_choice": "required"})
        await _ask(conn)
        core.answers.append(FakeSession(made, finish="length"))
        await _respond(conn, modality)
        return conn, queued

    conn, queued = asyncio.run(run())
    events = _since(queued, "response.created")
    assert _kinds(events) == ["response.created", "response.done"]
    response = events[-1]["response"]
    assert response["status"] == "incomplete" and response["output"] == []
    assert response["status_details"] == {"type": "incomplete", "reason": "max_output_tokens"}
    assert [i.type for i in conn.conversation.items.values()] == ["message"]
    assert check_server_events(queued, beta=False) == []


def test_a_result_goes_into_the_next_prompt_as_a_tool_turn():
    async def run() -> tuple[Connection, FakeCore, list[dict]]:
        conn, core, queued = _connection()
        await _send(conn, type="session.update", session={"tools": [WEATHER]})
        await _ask(conn)
        core.answers.append(FakeSession([CALL]))
        await _respond(conn)
        call = next(i for i in conn.conversation.items.values() if i.type == "function_call")
        stranger = {"type": "function_call_output", "call_id": "call_nope", "output": "{}"}
        await _send(conn, type="conversation.item.create", event_id="e1", item=stranger)
        result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"sky": "clear"}'}
        await _send(conn, type="conversation.item.create", item=result)
        core.answers.append(FakeSession(["It is clear."]))
        await _respond(conn)
        return conn, core, queued

    _, core, queued = asyncio.run(run())
    error = next(e for e in queued if e["type"] == "error")
    assert error["error"]["param"] == "item.call_id" and error["error"]["event_id"] == "e1"
    added = [e["item"] for e in queued if e["type"] == "conversation.item.added"]
    assert {"type": "function_call_output", "output": '{"sky": "clear"}'}.items() <= added[-2].items()
    messages = core.requests[1].messages
    assert messages is not None
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    call = messages[1]["tool_calls"][0]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert messages[2] == {"role": "tool", "tool_call_id": call["id"], "content": '{"sky": "clear"}'}
    assert queued[-1]["response"]["output"][0]["type"] == "message"


def test_calls_join_the_assistant_turn_before_them_and_orphan_results_are_left_out():
    conversation = SimpleNamespace(items={})

    def add(item: Item) -> None:
        conversation.items[item.id] = item

    add(Item("u", "user", [{"type": "text", "text": "hi"}], []))
    add(Item("a", "assistant", [], [{"type": "output_audio"}], text="Let me look."))
    for n in (1, 2):
        add(
            Item(
                f"c{n}",
                "assistant",
                [],
                [],
                type="function_call",
                call_id=f"call_{n}",
                name="f",
                arguments="{}",
            )
        )
    add(Item("o1", "tool", [], [], type="function_call_output", call_id="call_1", output="1"))
    add(
        Item("o9", "tool", [], [], type="function_call_output", call_id="call_9", output="9")
    )  # its call went
    messages = messages_of(conversation, None)  # type: ignore[arg-type]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["content"] == "Let me look."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1", "call_2"]


def test_a_client_may_create_a_call_and_its_result():
    async def run() -> tuple[FakeCore, list[dict]]:
        conn, core, queued = _connection()
        await _ask(conn)
        call = {
            "type": "function_call",
            "call_id": "call_7",
            "name": "get_weather",
            "arguments": '{"city": "Rome"}',
        }
        await _send(conn, type="conversation.item.create", item=call)
        await _send(conn, type="conversation.item.create", event_id="e1", item={"type": "function_call"})
        result = {"type": "function_call_output", "call_id": "call_7", "output": "sunny"}
        await _send(conn, type="conversation.item.create", item=result)
        core.answers.append(FakeSession(["Sunny."]))
        await _respond(conn)
        return core, queued

    core, queued = asyncio.run(run())
    error = next(e for e in queued if e["type"] == "error")
    assert error["error"]["param"] == "item.name" and error["error"]["event_id"] == "e1"
    messages = core.requests[0].messages
    assert messages is not None and [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["tool_calls"][0]["id"] == "call_7" and messages[2]["tool_call_id"] == "call_7"
    assert core.requests[0].tools is None  # the session offers no tools
