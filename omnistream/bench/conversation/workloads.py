"""The conversations `omnistream bench --conversation` times, as a client holds them: a realtime
session of spoken turns, a REST chat that re-sends its history, and concurrent REST chats; each
turn's numbers as the client saw them (`Turn`). The package's docstring says what each measures."""

from __future__ import annotations

import asyncio
import base64
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from omnistream.bench.stats import RequestResult

if TYPE_CHECKING:
    from omnistream.bench.clients import RestGatewayClient
    from omnistream.request.defaults import RequestInput

Row = dict[str, Any]  # a JSON object of the results: a turn, a merged turn, a concurrency run

# Spoken user turns (espeak-ng takes 3-5 s for each), and the REST chat's turns as text.
SENTENCES = (
    "Hello there, could you tell me what the weather is like today?",
    "I am planning a small trip to the mountains next weekend with friends.",
    "What should I pack if the nights are going to be quite cold?",
    "We will probably drive, and the road takes about four hours each way.",
    "Do you know any good games to play in the car on the way?",
    "One of my friends is vegetarian, so we need to plan the meals carefully.",
    "Could you suggest a simple dinner we can cook over a camp fire?",
    "I also want to take some photos of the stars at night.",
    "What settings would you use on a camera for pictures of the night sky?",
    "My phone battery always runs out quickly when it is cold outside.",
    "Is it better to keep the phone in a pocket or in the backpack?",
    "We might see some deer or even a fox near the lake in the morning.",
    "How far away should we stay from wild animals to be safe?",
    "On Sunday we would like to hike to the top of the nearest peak.",
    "How much water should each person carry for a six hour hike?",
    "If it starts raining, we will have to change our plans for the day.",
    "What could we do indoors in a small mountain village when it rains?",
    "I would like to bring back a small gift for my grandmother.",
    "She likes honey and wool, and she collects little wooden birds.",
    "Thank you, that was helpful, please summarize the plan in one sentence.",
)
SYSTEM = "You are a helpful voice assistant. Keep your answers short."
TURN_TIMEOUT_S = 300.0


@dataclass
class Turn:
    """One turn of a conversation as the client saw it (times in ms from the turn's request)."""

    turn: int
    ttft_ms: float | None = None
    ttfp_ms: float | None = None
    e2e_ms: float | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    audio_seconds: float = 0.0
    error: str = ""
    gateway_ttft_ms: float | None = None  # realtime: as the gateway measured it (response.omnistream)
    # realtime: how many of the answer's tokens had come when its first text did (response.omnistream:
    # 1 unless the first were bytes of an unfinished character or came in one chunk)
    tokens_at_first_text: int | None = None

    @property
    def cached_share(self) -> float | None:
        if self.input_tokens is None or self.cached_tokens is None or not self.input_tokens:
            return None
        return self.cached_tokens / self.input_tokens

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"cached_share": self.cached_share}


def _ms(start: float, at: float | None) -> float | None:
    return None if at is None else 1000.0 * (at - start)


def turn_from_result(turn: int, result: RequestResult) -> Turn:
    """A REST turn's numbers from the client's record of its stream."""
    return Turn(
        turn=turn,
        ttft_ms=None if result.ttft is None else 1000.0 * result.ttft,
        ttfp_ms=None if result.ttfp is None else 1000.0 * result.ttfp,
        e2e_ms=1000.0 * result.e2e,
        input_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens,
        output_tokens=result.tokens,
        audio_seconds=result.audio_seconds,
        error="" if result.ok else (result.error or "failed"),
    )


def user_text(turn: int, offset: int = 0) -> str:
    """Turn `turn`'s (1-based) user sentence; `offset` rotates them for another conversation."""
    return SENTENCES[(turn - 1 + offset) % len(SENTENCES)]


@dataclass(frozen=True)
class Answer:
    """How long each turn's answer is: greedy, exactly `max_tokens` tokens, at most `audio_frames`."""

    max_tokens: int = 16
    audio_frames: int = 24
    seed: int = 0

    def rest_input(self, messages: list[Row]) -> RequestInput:
        from omnistream.request.defaults import RequestInput

        return RequestInput(
            messages=messages,
            max_tokens=self.max_tokens,
            ignore_eos=True,
            temperature=0.0,
            seed=self.seed,
            max_audio_frames=self.audio_frames,
            talker_temperature=0.0,
            talker_repetition_penalty=1.0,
        )


async def rest_conversation(
    client: RestGatewayClient, turns: int, answer: Answer, offset: int = 0, out: list[Turn] | None = None
) -> list[Turn]:
    """One REST chat of `turns` turns, each re-sending the whole history. `client`: a
    RestGatewayClient; `out`: where the turns go as they end (also those before a failure)."""
    history: list[Row] = [{"role": "system", "content": SYSTEM}]
    out = [] if out is None else out
    for turn in range(1, turns + 1):
        history.append({"role": "user", "content": user_text(turn, offset)})
        result = await client.chat(answer.rest_input(list(history)))
        out.append(turn_from_result(turn, result))
        # A failed turn's answer is whatever arrived: the conversation goes on as a client's would.
        history.append({"role": "assistant", "content": result.text or "..."})
    return out


async def concurrent_rest(
    client: RestGatewayClient, conversations: int, turns: int, answer: Answer
) -> tuple[Row, list[list[Turn]]]:
    """`conversations` REST chats at once, each with its own words (a conversation's number opens
    its first turn, so they share only the system prompt): throughput over all their turns."""
    results: list[list[RequestResult]] = [[] for _ in range(conversations)]

    async def one(k: int) -> list[Turn]:
        history: list[Row] = [{"role": "system", "content": SYSTEM}]
        out = []
        for turn in range(1, turns + 1):
            text = user_text(turn, 3 * k)
            history.append({"role": "user", "content": f"Caller {k + 1}. {text}" if turn == 1 else text})
            result = await client.chat(answer.rest_input(list(history)))
            results[k].append(result)
            out.append(turn_from_result(turn, result))
            history.append({"role": "assistant", "content": result.text or "..."})
        return out

    started = time.perf_counter()
    per_conversation = await asyncio.gather(*(one(k) for k in range(conversations)))
    wall = time.perf_counter() - started
    done = [r for rs in results for r in rs]
    ok = [r for r in done if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    summary = {
        "concurrency": conversations,
        "turns_each": turns,
        "turns": len(done),
        "failed": len(done) - len(ok),
        "errors": sorted({r.error for r in done if not r.ok})[:5],
        "wall_s": wall,
        "audio_seconds": sum(r.audio_seconds for r in ok),
        "output_tokens": sum(r.tokens for r in ok),
        "audio_throughput": sum(r.audio_seconds for r in ok) / wall,
        "output_token_throughput": sum(r.tokens for r in ok) / wall,
        "turn_throughput": len(ok) / wall,
        "ttft_ms_mean": 1000.0 * statistics.mean(ttfts) if ttfts else None,
    }
    return summary, list(per_conversation)


async def _events_until(ws: Any, done: Callable[[Row], bool], timeout: float) -> list[tuple[float, Row]]:
    """Server events (with their arrival times) up to and including the first for which `done`."""
    seen = []
    async with asyncio.timeout(timeout):
        async for raw in ws:
            event = json.loads(raw)
            seen.append((time.perf_counter(), event))
            if done(event):
                return seen
    raise ConnectionError("the session closed")


def realtime_turn_from_events(turn: int, start: float, events: list[tuple[float, Row]], rate: int) -> Turn:
    """A realtime turn's numbers from the events after its response.create (sent at `start`)."""
    out = Turn(turn=turn)
    for at, event in events:
        kind = event["type"]
        if kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            if out.ttft_ms is None and event.get("delta"):
                out.ttft_ms = _ms(start, at)
        elif kind == "response.output_audio.delta":
            samples = len(base64.b64decode(event.get("delta") or "")) // 2
            if samples and out.ttfp_ms is None:
                out.ttfp_ms = _ms(start, at)
            out.audio_seconds += samples / rate
        elif kind == "error" and not out.error:
            out.error = event["error"].get("message", "error")[:200]
        elif kind == "response.done":
            out.e2e_ms = _ms(start, at)
            response = event["response"]
            extra = response.get("omnistream") or {}
            out.gateway_ttft_ms, out.tokens_at_first_text = (
                extra.get("ttft_ms"),
                extra.get("tokens_at_first_text"),
            )
            usage = response.get("usage") or {}
            out.input_tokens = usage.get("input_tokens")
            out.cached_tokens = (usage.get("input_token_details") or {}).get("cached_tokens")
            out.output_tokens = usage.get("output_tokens")
            status, details = response.get("status"), response.get("status_details") or {}
            # ignore EOS: every answer runs to max_output_tokens, which the API calls incomplete
            finished = status == "completed" or (
                status == "incomplete" and details.get("reason") == "max_output_tokens"
            )
            if not finished and not out.error:
                out.error = f"response {response.get('status')}: {response.get('status_details')}"[:200]
    return out


async def realtime_conversation(
    base_url: str,
    turns: int,
    answer: Answer,
    offset: int = 0,
    rate: int = 24000,
    out: list[Turn] | None = None,
    turn_seconds: float = 0.0,
) -> list[Turn]:
    """One realtime session of `turns` spoken turns (no turn detection: each turn an input_audio
    item, then response.create once the item is in the conversation); `out`: where the turns go
    as they end (also those before a failure); `turn_seconds`: each turn's speech ends in silence
    up to this length (a longer sentence is sent whole)."""
    import websockets

    from omnistream.bench.speech import speech_pcm16, until

    url = base_url.replace("http", "ws", 1).rstrip("/") + "/v1/realtime"
    session = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "instructions": SYSTEM,
        "audio": {"input": {"turn_detection": None}},
        "max_output_tokens": answer.max_tokens,
        "temperature": 0.0,
        "omnistream": {"ignore_eos": True, "seed": answer.seed, "max_audio_frames": answer.audio_frames},
    }
    out = [] if out is None else out
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await _events_until(ws, lambda e: e["type"] in ("session.updated", "error"), TURN_TIMEOUT_S)
        for turn in range(1, turns + 1):
            pcm = until(speech_pcm16(user_text(turn, offset)), turn_seconds)
            item_id = f"user-{turn}"
            item = {
                "id": item_id,
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": base64.b64encode(pcm).decode()}],
            }
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))

            def added_or_refused(event: Row, item_id: str = item_id) -> bool:
                done = event["type"] == "conversation.item.done" and event["item"].get("id") == item_id
                return bool(done or event["type"] == "error")

            added = await _events_until(ws, added_or_refused, TURN_TIMEOUT_S)
            if added[-1][1]["type"] == "error":
                out.append(Turn(turn=turn, error=added[-1][1]["error"].get("message", "error")[:200]))
                continue
            start = time.perf_counter()
            await ws.send(json.dumps({"type": "response.create"}))
            try:
                events = await _events_until(ws, lambda e: e["type"] == "response.done", TURN_TIMEOUT_S)
            except TimeoutError:
                out.append(Turn(turn=turn, error="no response.done"))
                break
            out.append(realtime_turn_from_events(turn, start, events, rate))
    return out
