"""A conversation keeps what the thinker's context holds: the thinker's counts of earlier prompts
are kept per item, only what it has not counted is estimated (high), and before a turn that would
not fit the oldest items go, and only those. Connection-level tests run turns against a fake
thinker that counts prompts its own way and refuses them past its max_model_len as the real one."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gateway.config import GatewayConfig
from gateway.realtime.connection import Connection
from gateway.realtime.context import (
    ANSWER_SLACK,
    AUDIO_WINDOW_TOKENS,
    MESSAGE_TOKENS,
    REPLY_PROMPT_TOKENS,
    ContextFull,
    audio_tokens,
    estimate,
    fit,
    image_tokens,
    measure,
    overflow_of,
    prompt_tokens,
    shape_of,
)
from gateway.realtime.outbound import Outbound
from gateway.realtime.session import Conversation, HistoryLimits, Item
from gateway.serving.session import Timings
from omnistream.request.errors import InvalidRequest, Unavailable
from omnistream.request.generation import DoneEvent, TextEvent
from omnistream.request.media import AudioInput, ImageInput


def user(item_id: str, text: str = "") -> Item:
    return Item(item_id, "user", [{"type": "text", "text": text or item_id}], [])


def answer(item_id: str, text: str, generated: int | None = None) -> Item:
    return Item(item_id, "assistant", [], [{"type": "output_text"}], text=text, generated_tokens=generated)


# -- estimates -----------------------------------------------------------------------------------
def _processor_audio_tokens(samples: int, n_window: int = 50) -> int:
    """What the thinker's processor makes of `samples` of 16 kHz audio: n // 160 mel frames, 13
    tokens per 100 (omnistream/models/qwen3_omni/thinker/thinker_media.py `audio_tokens`), plus
    the two markers."""
    frames = samples // 160
    chunk = n_window * 2
    rest = frames % chunk
    feat = (rest - 1) // 2 + 1
    return ((feat - 1) // 2 + 1 - 1) // 2 + 1 + (frames // chunk) * 13 + 2


@pytest.mark.parametrize("seconds", [0.1, 0.5, 0.99, 1.0, 1.01, 2.0, 3.5, 10.0, 59.99, 60.0, 600.0])
def test_the_audio_estimate_is_at_least_what_the_thinker_counts_and_close_to_it(seconds):
    model = _processor_audio_tokens(round(seconds * 16000))
    assert model <= audio_tokens(seconds) <= model + 2 * AUDIO_WINDOW_TOKENS
    # about 13 tokens a second: ten minutes of audio is ~7800 tokens
    assert audio_tokens(600.0) == 7815


def test_text_is_estimated_as_a_token_per_byte_and_an_answer_as_what_was_generated():
    assert estimate(user("u", "héllo")) == MESSAGE_TOKENS + 6
    assert estimate(answer("a", "x" * 400)) == MESSAGE_TOKENS + 400
    assert estimate(answer("a", "x" * 400, generated=90)) == MESSAGE_TOKENS + 92
    assert estimate(answer("a", "", generated=90)) == 0  # no words: not in the prompt
    audio = AudioInput(np.zeros(32000, np.float32))
    image = ImageInput(np.zeros((64, 96, 3), np.uint8))
    item = Item("m", "user", [{"type": "audio", "audio": audio}, {"type": "image", "image": image},
                              {"type": "text", "text": "what?"}], [], audio_seconds=2.0)  # fmt: skip
    assert estimate(item) == MESSAGE_TOKENS + audio_tokens(2.0) + image_tokens(64, 96) + 5
    assert image_tokens(64, 96) == 2 * 3 + 2


# -- measuring -----------------------------------------------------------------------------------
def test_the_thinkers_count_is_kept_per_item_and_only_new_items_are_estimated():
    c = Conversation()
    c.add(user("u1", "x" * 100))
    shape = shape_of(c, "Be brief.")
    assert measure(c, shape, 40)
    assert prompt_tokens(c, "Be brief.") == 40  # exact now
    # the system message and the user item shared the count in proportion to their estimates
    assert c.system_tokens is not None and c.system_tokens[0] == "Be brief."
    assert c.system_tokens[1] + c.items["u1"].tokens + REPLY_PROMPT_TOKENS == 40
    c.add(answer("a1", "y" * 50, generated=12))
    c.add(user("u2", "z" * 20))
    assert prompt_tokens(c, "Be brief.") == 40 + (MESSAGE_TOKENS + 14) + (MESSAGE_TOKENS + 20)
    assert measure(c, shape_of(c, "Be brief."), 40 + 18 + 12)
    # the answer's near-exact estimate is its share; the user item takes the rest
    assert (c.items["a1"].tokens, c.items["u2"].tokens) == (MESSAGE_TOKENS + 14, 30 - MESSAGE_TOKENS - 14)
    assert prompt_tokens(c, "Be brief.") == 70
    assert prompt_tokens(c, "Other instructions.") == 70 - c.system_tokens[1] + MESSAGE_TOKENS + 19


def test_a_delete_or_truncate_under_a_measured_prompt_voids_that_measurement():
    c = Conversation()
    c.add(user("u1"))
    a1 = answer("a1", "spoken words", generated=3)
    c.add(a1)
    c.add(user("u2"))
    shape = shape_of(c, None)
    a1.truncate(0)  # (no audio made: the text stays, but what it says may have changed)
    assert not measure(c, shape, 30)
    assert all(i.tokens is None for i in c.items.values())
    shape = shape_of(c, None)
    c.delete("u1")
    assert not measure(c, shape, 30)
    assert measure(c, shape_of(c, None), 30)
    assert prompt_tokens(c, None) == 30
    c.delete("a1")  # its tokens go with it
    assert prompt_tokens(c, None) == 30 - c_tokens_of(a1)


def c_tokens_of(item: Item) -> int:
    assert item.tokens is not None
    return item.tokens


def test_a_count_that_contradicts_what_is_known_teaches_nothing():
    c = Conversation()
    c.add(user("u1"))
    assert measure(c, shape_of(c, None), 20)
    c.add(user("u2"))
    assert not measure(c, shape_of(c, None), 20)  # u2 would take no token
    assert c.items["u2"].tokens is None


# -- fitting -------------------------------------------------------------------------------------
def _turns(c: Conversation, n: int, tokens: int) -> None:
    """n measured user/answer pairs of `tokens` each."""
    for k in range(n):
        c.add(user(f"u{k}"))
        c.items[f"u{k}"].tokens = tokens
        c.add(answer(f"a{k}", "words", generated=2))
        c.items[f"a{k}"].tokens = tokens


def test_only_what_would_overflow_is_dropped_oldest_first_never_the_newest_user_item():
    c = Conversation()
    _turns(c, 5, 100)  # 1000 tokens
    c.add(user("new"))
    c.items["new"].tokens = 100
    assert fit(c, None, 4096, 256) == []
    # 1100 + 3 + a 256-token answer in 1200: 159 too many -> the two oldest items go
    drops = fit(c, None, 1200, 256)
    assert [d.item.id for d in drops] == ["u0", "a0"] and {d.reason for d in drops} == {"context"}
    # the newest user item alone does not fit: nothing goes, the turn is refused
    with pytest.raises(ContextFull, match="cannot fit the model's context"):
        fit(c, None, 300, 256)
    # what follows the newest user item (a client's own assistant item) and system items stay
    c.add(Item("s", "system", [{"type": "text", "text": "Be brief."}], []))
    c.add(answer("after", "prefilled", generated=3))
    droppable = [i.id for i in c.droppable()]
    assert droppable == [f"{r}{k}" for k in range(5) for r in "ua"]


def test_twenty_turns_fit_the_default_context():
    c = Conversation(HistoryLimits.of(GatewayConfig()))
    for k in range(20):
        c.add(user(f"u{k}", "What time is it, please?"))
        assert fit(c, "Be brief.", 4096, 256) == []
        c.add(answer(f"a{k}", "It is noon, more or less.", generated=8))
    assert len(c.items) == 40


def test_the_stage_message_bound_drops_the_oldest_audio_before_a_turn():
    second = AudioInput(np.zeros(16000, np.float32))  # 64000 bytes
    c = Conversation(HistoryLimits(max_bytes=150_000, max_chars=10**6))
    for k in range(2):
        c.add(Item(f"u{k}", "user", [{"type": "audio", "audio": second}], [], audio_seconds=1.0))
    c.add(user("u2", "and this?"))
    drops = fit(c, "x" * 30_000, 10**6, 256)  # long instructions share the message
    assert [(d.item.id, d.reason) for d in drops] == [("u0", "message_size")]


def test_the_thinkers_refusal_names_the_prompts_length():
    text = InvalidRequest("prompt (4000 tokens) + max_tokens (256) exceeds the model length 4096")
    media = InvalidRequest("the prompt (5000 tokens with its media) exceeds the model length 4096")
    assert overflow_of(text) == (4000, 4096) and overflow_of(media) == (5000, 4096)
    assert overflow_of(InvalidRequest("unknown voice 'x'")) is None
    assert overflow_of(Unavailable("prompt (1 tokens) exceeds the model length 2")) is None


# -- a connection against a fake thinker ---------------------------------------------------------
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
        deployment = SimpleNamespace(model_id="m", voices=None, input_modalities=None, max_model_len=reported)
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
