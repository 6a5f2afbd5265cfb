"""A connection's responses keep the conversation within the thinker's context (responder.py):
turns run against a fake thinker that counts prompts its own way and refuses them past its
max_model_len as the real one; the oldest items go only when needed, a turn that cannot fit is
refused, and a refusal the estimate did not foresee is corrected by the thinker's count and sent
once more. A response with its own `input` is made from it alone, and an out-of-band one
(`conversation: "none"`) leaves the conversation as it was."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace
from typing import Any

import numpy as np

from gateway.config import GatewayConfig
from gateway.realtime.connection import Connection
from gateway.realtime.context import ANSWER_SLACK, MESSAGE_TOKENS, REPLY_PROMPT_TOKENS, prompt_tokens
from gateway.realtime.conversation import Item
from gateway.realtime.outbound import Outbound
from gateway.serving.session import Timings
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import DoneEvent, TextEvent
from omnistream.request.media import ImageInput


class FakeThinker:
    """Counts a prompt as a ChatML tokenizer of ~4 bytes a token would (an image: one token per
    8 x 8 pixels, as the tiny model's vision patches, more than the gateway's estimate), answers
    with `answer_tokens` tokens, and refuses a prompt past its context with the thinker's words."""

    def __init__(self, max_model_len: int, answer_tokens: int = 6) -> None:
        self.max_model_len = max_model_len
        self.answer_tokens = answer_tokens
        self.prompts: list[int] = []
        self.refused = 0

    def count(self, messages: list[dict[str, Any]]) -> int:
        total = REPLY_PROMPT_TOKENS
        for message in messages:
            content = message["content"]
            parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
            total += MESSAGE_TOKENS
            for part in parts:
                if part["type"] == "text":
                    total += math.ceil(len(part["text"].encode()) / 4)
                elif part["type"] == "image":
                    height, width = part["image"].pixels.shape[:2]
                    total += height * width // 64 + 2
        return total

    async def open(self, request: Any, trace: Any = None) -> Any:
        n = self.count(request.messages)
        if n + request.max_tokens > self.max_model_len:
            self.refused += 1
            raise InvalidRequest(
                f"prompt ({n} tokens) + max_tokens ({request.max_tokens}) exceeds the model length "
                f"{self.max_model_len}",
                field="max_tokens",
            )
        self.prompts.append(n)
        k = self.answer_tokens
        done = DoneEvent([0] * n, [1] * (k + 1), "stop", 0, 0, None, None, 0.0)
        return FakeSession([TextEvent([1] * k, "word " * k), done])


class FakeSession:
    def __init__(self, events: list[Any]) -> None:
        self._events = events
        self.replica_addresses: dict[str, str] = {}
        self.timings = Timings(0.0)
        self.first_chunk_s = None  # no audio planned

    async def events(self) -> Any:
        for event in self._events:
            yield event

    async def aclose(self) -> None:
        pass

    def listening(self) -> Any:
        return SimpleNamespace(heard=False)


class Harness:
    def __init__(self, thinker: FakeThinker, reported: int | None, **config: Any) -> None:
        self.events: list[dict] = []
        self.drops: list[tuple[str, int]] = []
        outbound = Outbound(lambda text: asyncio.sleep(0))
        outbound.put = self._put  # type: ignore[method-assign]
        deployment = SimpleNamespace(
            model_id="m", voices=None, default_voice=None, input_modalities=None, max_model_len=reported
        )
        media = SimpleNamespace(decode=self._decode)
        core = SimpleNamespace(
            config=GatewayConfig(thinker=["a:1"], **config),
            deployment=deployment,
            media=media,
            open=thinker.open,
        )
        self.conn = Connection(core, outbound, False, None, on_drop=lambda r, n: self.drops.append((r, n)))  # type: ignore[arg-type]

    async def _put(self, event: dict | None, owner: Any = None, samples: int = 0) -> None:
        if event is not None:
            self.events.append(event)

    @staticmethod
    async def _decode(messages: Any, use_audio_in_video: bool) -> int:
        return 0

    async def send(self, **event: Any) -> None:
        await self.conn.handle_text(json.dumps(event))

    async def turn(self, text: str, max_output_tokens: int = 32) -> dict:
        """A user text item, then a text response; returns its response.done (or the error)."""
        content = [{"type": "input_text", "text": text}]
        await self.send(
            type="conversation.item.create", item={"type": "message", "role": "user", "content": content}
        )
        return await self.respond(max_output_tokens)

    async def respond(self, max_output_tokens: int = 32) -> dict:
        start = len(self.events)
        await self.send(
            type="response.create",
            response={"output_modalities": ["text"], "max_output_tokens": max_output_tokens},
        )
        if self.conn.response is not None:
            await self.conn.response.wait()
        return next(e for e in self.events[start:] if e["type"] in ("response.done", "error"))

    def deleted(self) -> list[str]:
        return [e["item_id"] for e in self.events if e["type"] == "conversation.item.deleted"]


def test_twenty_turns_on_the_default_context_keep_every_item():
    async def run() -> tuple[Harness, list[int]]:
        h = Harness(FakeThinker(4096), reported=4096)
        inputs = []
        for k in range(20):
            done = await h.turn(f"Turn {k}: what time is it now, please?")
            assert done["type"] == "response.done" and done["response"]["status"] == "completed"
            inputs.append(done["response"]["usage"]["input_tokens"])
        return h, inputs

    h, inputs = asyncio.run(run())
    assert len(h.conn.conversation.items) == 40 and h.deleted() == [] and h.drops == []
    assert inputs == sorted(inputs) and inputs[-1] > inputs[15] > inputs[0]  # the prompt kept growing
    # the counts kept are the thinker's: the next prompt is known but for the last answer, which
    # is estimated as the 7 tokens generated for it
    assert prompt_tokens(h.conn.conversation, None) == inputs[-1] + MESSAGE_TOKENS + 7 + ANSWER_SLACK


def test_a_small_context_drops_the_oldest_turns_only_when_needed_and_keeps_the_newest():
    async def run() -> tuple[Harness, FakeThinker, list[dict]]:
        thinker = FakeThinker(4096)
        h = Harness(thinker, reported=4096, realtime_context_tokens=400)
        dones = [await h.turn(f"Turn {k}: " + "tell me more " * 8) for k in range(12)]
        return h, thinker, dones

    h, thinker, dones = asyncio.run(run())
    assert all(d["type"] == "response.done" and d["response"]["status"] == "completed" for d in dones)
    assert thinker.refused == 0
    deleted = h.deleted()
    assert deleted and h.drops and {r for r, _ in h.drops} == {"context"}
    kept = list(h.conn.conversation.items)
    # oldest first: what was dropped is exactly the items before the first kept one
    created = [e["item"]["id"] for e in h.events if e["type"] == "conversation.item.added"]
    created = list(dict.fromkeys(created))
    assert deleted == created[: len(deleted)] and kept == created[len(deleted) :]
    # every prompt fits the 400-token context with its answer's 32, and the first turns kept all
    assert all(n + 32 <= 400 for n in thinker.prompts)
    first_drop = next(i for i, e in enumerate(h.events) if e["type"] == "conversation.item.deleted")
    before = sum(1 for e in h.events[:first_drop] if e["type"] == "response.done")
    assert before >= 5
    # only what would overflow went: once full, every prompt stays within a turn (46 tokens) and
    # the new turn's overestimate (117 estimated, 33 counted) of the context
    assert all(n + 32 > 400 - 46 - (117 - 33) for n in thinker.prompts[before:])


def test_a_turn_that_cannot_fit_even_alone_is_refused_with_an_error_and_drops_nothing():
    async def run() -> tuple[Harness, dict]:
        h = Harness(FakeThinker(4096), reported=300)
        await h.turn("Hello there.")
        return h, await h.turn("x" * 2000)

    h, error = asyncio.run(run())
    assert error["type"] == "error" and error["error"]["code"] == "context_length_exceeded"
    assert "cannot fit the model's context" in error["error"]["message"]
    assert h.deleted() == [] and len(h.conn.conversation.items) == 3  # the session goes on
    assert not [e for e in h.events if e["type"] == "response.created"][1:]


def test_an_estimate_the_thinker_refuses_is_corrected_by_its_count_and_sent_once_more():
    """An image on a model with smaller vision patches takes more tokens than the estimate: the
    thinker's refusal names the prompt's length, the oldest items go, the turn runs."""

    async def run() -> tuple[Harness, FakeThinker, dict]:
        thinker = FakeThinker(600)
        h = Harness(thinker, reported=600)
        for k in range(4):
            await h.turn(f"Turn {k}: " + "tell me more " * 8)
        image = ImageInput(np.zeros((64, 64, 3), np.uint8))  # the fake thinker: 66 tokens, estimate 6
        item = Item("img", "user", [{"type": "image", "image": image}], [{"type": "input_image"}])
        await h.conn._add_item(item, h.conn.conversation.last_id())
        used = prompt_tokens(h.conn.conversation, None)
        return h, thinker, await h.respond(max_output_tokens=600 - used)

    h, thinker, done = asyncio.run(run())
    assert thinker.refused == 1
    assert done["type"] == "response.done" and done["response"]["status"] == "completed"
    assert h.deleted() and "img" in h.conn.conversation.items


def test_a_delete_takes_its_tokens_away_and_the_next_estimate_still_bounds_the_prompt():
    async def run() -> tuple[Harness, FakeThinker, list[dict], int]:
        thinker = FakeThinker(4096)
        h = Harness(thinker, reported=4096)
        dones = [await h.turn("Hello there, how are you?") for _ in range(3)]
        conversation = h.conn.conversation
        answer_id = dones[0]["response"]["output"][0]["id"]
        first_user = next(iter(conversation.items))
        assert all(i.tokens is not None for i in list(conversation.items.values())[:-1])
        await h.send(type="conversation.item.delete", item_id=first_user)
        await h.send(type="conversation.item.delete", item_id=answer_id)
        assert first_user not in conversation.items and answer_id not in conversation.items
        content = [{"type": "input_text", "text": "And now?"}]
        await h.send(
            type="conversation.item.create", item={"type": "message", "role": "user", "content": content}
        )
        estimated = prompt_tokens(conversation, None)
        dones.append(await h.respond())
        return h, thinker, dones, estimated

    h, thinker, dones, estimated = asyncio.run(run())
    assert dones[-1]["response"]["status"] == "completed" and h.deleted() == [h.deleted()[0], h.deleted()[1]]
    counted = dones[-1]["response"]["usage"]["input_tokens"]
    assert counted == thinker.prompts[-1] < dones[-2]["response"]["usage"]["input_tokens"]
    # estimated high only for what the thinker had not counted: the last answer and "And now?"
    assert 0 <= estimated - counted <= (MESSAGE_TOKENS + 8) - (MESSAGE_TOKENS + 2) + ANSWER_SLACK


def _out_of_band(response: dict[str, Any], beta: bool = False) -> tuple[list[dict], list[Any], list[str]]:
    """A conversation of one user item and its answer, then response.create with `response`: the
    events sent for that response, the requests the stages got, and the conversation's ids after."""
    from tests.unit.gateway.realtime.test_server_event_schemas import FakeSession, connect

    async def run() -> tuple[list[dict], list[Any], list[str]]:
        conn, core, events, send = connect(beta)
        requests: list[Any] = []
        opened = core.open

        async def record(request: Any, trace: Any = None) -> Any:
            requests.append(request)
            return await opened(request, trace)

        core.open = record  # type: ignore[method-assign]
        hello = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello"}]}
        await send(type="conversation.item.create", item={**hello, "id": "item_hello"})
        core.answers.append(FakeSession("Hi.", audio=False))
        await send(type="response.create", response={"output_modalities": ["text"]})
        before = len(events)
        core.answers.append(FakeSession("Aside.", audio=False))
        await send(type="response.create", response={"output_modalities": ["text"], **response})
        return events[before:], requests[1:], list(conn.conversation.items)

    return asyncio.run(run())


SUM_UP = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Sum up"}]}


def test_an_out_of_band_response_answers_its_own_input_and_leaves_the_conversation_untouched():
    events, requests, items = _out_of_band(
        {
            "conversation": "none",
            "metadata": {"k": "v"},
            "input": [{"type": "item_reference", "id": "item_hello"}, SUM_UP],
        }
    )
    assert not [e["type"] for e in events if e["type"].startswith("conversation.")]
    assert len(items) == 2  # the user item and its first answer, nothing more
    prompt = [(m["role"], [p["text"] for p in m["content"]]) for m in requests[0].messages]
    assert prompt == [("user", ["Hello"]), ("user", ["Sum up"])]  # its input: not the answer "Hi."
    done = events[-1]["response"]
    assert (done["conversation_id"], done["metadata"], done["status"]) == (None, {"k": "v"}, "completed")
    assert done["output"][0]["content"][0]["text"] == "Aside."


def test_an_out_of_band_response_without_input_reads_the_conversation_and_adds_nothing():
    events, requests, items = _out_of_band({"conversation": "none"})
    assert len(items) == 2 and "Hi." in json.dumps(requests[0].messages, default=str)
    assert not [e for e in events if e["type"].startswith("conversation.")]


def test_a_response_with_input_in_the_conversation_adds_its_answer_but_reads_only_its_input():
    events, requests, items = _out_of_band({"input": [SUM_UP]})
    text = json.dumps(requests[0].messages, default=str)
    assert "Sum up" in text and "Hello" not in text and "Hi." not in text
    assert len(items) == 3 and any(e["type"] == "conversation.item.added" for e in events)


def test_an_input_naming_an_unknown_item_is_refused_naming_it():
    events, requests, items = _out_of_band(
        {"conversation": "none", "input": [{"type": "item_reference", "id": "x"}]}
    )
    assert requests == [] and len(items) == 2
    assert (events[-1]["error"]["code"], events[-1]["error"]["param"]) == (
        "item_not_found",
        "response.input.0.id",
    )
