"""/v1/realtime function calling end to end with the official openai SDK, on the real processes:
a `required` call (enforced by the thinker's grammar, so it holds on the random tiny model) is a
function_call item with streamed arguments that validate against the tool's schema and no audio;
its result given back as a function_call_output item is in the next, spoken answer's prompt; a
cancel or `max_output_tokens` while the arguments stream leaves no half call in the conversation,
and response.done lists it as it was made (incomplete) and says why; cut before its name, there is
nothing: no item, no sound."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
from openai import AsyncOpenAI

from tests.integration.conftest import configured_gateway, gateway_idle, gateway_url, wait_for
from tests.integration.test_chat_tools import WEATHER_SCHEMA  # the same tool as the chat tests

API_KEY = "realtime-tools-key"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Today's weather.",
    "parameters": WEATHER_SCHEMA,
}
# A call whose arguments take a while to write: the window a cancel lands in.
NOTE = {
    "type": "function",
    "name": "take_note",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string", "minLength": 1000}},
        "required": ["text"],
        "additionalProperties": False,
    },
}
FORECAST = json.dumps({"sky": "clear", "forecast": "sunny and warm all day, " * 12})


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    with configured_gateway(stages, tmp_path_factory.mktemp("realtime-tools"), {"api_key": API_KEY}) as gw:
        yield gw


def client(gateway) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gateway_url(gateway)}/v1", api_key=API_KEY)


async def events_until(conn, kind: str, seen: list, timeout: float = 120.0):
    async with asyncio.timeout(timeout):
        async for event in conn:
            seen.append(event)
            if event.type == kind:
                return event
    raise AssertionError(f"the connection closed before {kind}")


async def session(conn, tools: list, choice: str, max_output_tokens: int) -> None:
    await conn.recv()
    await conn.session.update(
        session={
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {"input": {"turn_detection": None}},
            "tools": tools,
            "tool_choice": choice,
            "max_output_tokens": max_output_tokens,
            "omnistream": {"seed": 3, "max_audio_frames": 20},
        }
    )
    updated = await conn.recv()
    assert updated.type == "session.updated", updated
    assert [t.name for t in updated.session.tools] == [t["name"] for t in tools]


async def ask(conn, text: str) -> None:
    content = [{"type": "input_text", "text": text}]
    await conn.conversation.item.create(item={"type": "message", "role": "user", "content": content})


def test_a_required_call_round_trip(gateway, stages):
    async def run() -> None:
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            await session(conn, [WEATHER], "required", 200)
            await ask(conn, "What is the weather in Paris?")
            await conn.response.create()
            seen: list = []
            done = await events_until(conn, "response.done", seen)
            response = done.response
            # One call or more (`required` in a session allows parallel calls), each whole one
            # valid; the random model may go on to the limit, the call it was in listed cut.
            assert all(o.type == "function_call" and o.name == "get_weather" for o in response.output)
            whole = [o for o in response.output if o.status == "completed"]
            assert whole and response.output[: len(whole)] == whole, response
            assert response.status == ("completed" if whole == response.output else "incomplete"), response
            for call in whole:
                jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
                deltas = [
                    e.delta
                    for e in seen
                    if e.type == "response.function_call_arguments.delta" and e.item_id == call.id
                ]
                assert "".join(deltas) == call.arguments
                args_done = next(
                    e
                    for e in seen
                    if e.type == "response.function_call_arguments.done" and e.item_id == call.id
                )
                assert args_done.call_id == call.call_id and args_done.arguments == call.arguments
            call = whole[0]
            kinds = [e.type for e in seen]
            assert "response.output_audio.delta" not in kinds  # the call is not spoken
            assert kinds.index("response.output_item.done") < kinds.index("response.done")

            # The result, then a spoken answer (free to speak now) whose prompt holds it.
            output = {"type": "function_call_output", "call_id": call.call_id, "output": FORECAST}
            await conn.conversation.item.create(item=output)
            await conn.response.create(response={"tool_choice": "auto", "max_output_tokens": 16})
            answer: list = []
            done2 = await events_until(conn, "response.done", answer)
            assert done2.response.status in ("completed", "incomplete"), done2.response
            assert done2.response.output[0].type == "message"
            assert any(e.type == "response.output_audio.delta" for e in answer)
            added = [e for e in answer if e.type == "conversation.item.added"]
            assert added[0].item.type == "function_call_output"
            # The prompt grew by the call and its (long) result.
            grown = done2.response.usage.input_tokens - response.usage.input_tokens
            assert grown > len(FORECAST) // 4, grown
        assert await wait_for(lambda: gateway_idle(gateway, stages), 10)

    asyncio.run(run())


def test_a_cancel_while_the_arguments_stream_leaves_no_half_call(gateway, stages):
    async def run() -> None:
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            await session(conn, [NOTE], "required", 1500)
            await ask(conn, "Note this down for me.")
            await conn.response.create()
            seen: list = []
            await events_until(conn, "response.function_call_arguments.delta", seen)
            await conn.response.cancel()
            done = await events_until(conn, "response.done", seen)
            assert done.response.status == "cancelled"
            added = next(e for e in seen if e.type == "response.output_item.added")
            closed = next(e for e in seen if e.type == "response.output_item.done")
            assert closed.item.id == added.item.id and closed.item.status == "incomplete"
            assert done.response.output == [closed.item]  # listed as it was cut (issue 59)
            deleted = [e.item_id for e in seen if e.type == "conversation.item.deleted"]
            assert deleted == [added.item.id]
            assert "response.function_call_arguments.done" not in [e.type for e in seen]
            # The conversation goes on without it: a new turn's prompt has no call in it.
            await conn.session.update(session={"tool_choice": "none", "output_modalities": ["text"]})
            await ask(conn, "Never mind.")
            await conn.response.create(response={"max_output_tokens": 4})
            after: list = []
            done2 = await events_until(conn, "response.done", after)
            assert done2.response.status in ("completed", "incomplete"), done2.response
        assert await wait_for(lambda: gateway_idle(gateway, stages), 10)

    asyncio.run(run())


def test_a_call_cut_at_max_output_tokens_is_listed_incomplete_and_unspoken(gateway, stages):
    """Issue 59: the cut call was deleted and an empty message item made in its place. Now
    response.done lists it (incomplete, its arguments as made) with `status_details`; it leaves the
    conversation; no message item, no audio."""

    async def run() -> None:
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            await session(conn, [NOTE], "required", 80)  # its name comes, its 1000 characters do not
            await ask(conn, "Note this down for me.")
            await conn.response.create()
            seen: list = []
            done = await events_until(conn, "response.done", seen)
            response = done.response
            assert response.status == "incomplete", response
            assert response.status_details.type == "incomplete"
            assert response.status_details.reason == "max_output_tokens"
            (call,) = response.output
            assert (call.type, call.name, call.status) == ("function_call", "take_note", "incomplete")
            deltas = [e.delta for e in seen if e.type == "response.function_call_arguments.delta"]
            assert call.arguments == "".join(deltas) and call.arguments.startswith("{")
            kinds = [e.type for e in seen]
            assert "response.function_call_arguments.done" not in kinds
            assert not any(k.startswith(("response.output_audio", "response.content_part")) for k in kinds)
            deleted = [e.item_id for e in seen if e.type == "conversation.item.deleted"]
            assert deleted == [call.id]
            assert kinds.index("conversation.item.deleted") < kinds.index("response.done")
        assert await wait_for(lambda: gateway_idle(gateway, stages), 10)

    asyncio.run(run())


@pytest.mark.parametrize("seed", [2, 4])  # seeds whose answers spell "<tool_call>" a character a token
def test_a_forced_call_cut_before_its_name_is_nothing_and_says_nothing(gateway, stages, seed):
    """Issue 59: cut in its open marker, the answer was a message item whose transcript was
    "<tool_ca", and it was spoken. Now: an incomplete response with no output."""

    async def run() -> None:
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            await session(conn, [WEATHER], "required", 8)
            await conn.session.update(session={"omnistream": {"seed": seed, "max_audio_frames": 20}})
            assert (await conn.recv()).type == "session.updated"
            await ask(conn, "What is the weather in Paris?")
            await conn.response.create()
            seen: list = []
            done = await events_until(conn, "response.done", seen)
            assert done.response.status == "incomplete" and done.response.output == []
            assert done.response.status_details.reason == "max_output_tokens"
            kinds = [e.type for e in seen]
            assert kinds[kinds.index("response.created") + 1 :] == ["response.done"]
        assert await wait_for(lambda: gateway_idle(gateway, stages), 10)

    asyncio.run(run())
