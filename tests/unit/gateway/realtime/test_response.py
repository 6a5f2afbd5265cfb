"""A response stopped before its task first ran still ends with response.done (status cancelled);
response.done's omnistream fields carry what the listener heard of the turn and how many tokens had
come when its first text did."""

from __future__ import annotations

import asyncio
import json

from gateway.realtime.conversation import Item
from gateway.realtime.outbound import Outbound
from gateway.realtime.protocol import Protocol
from gateway.realtime.response import ResponseRun
from gateway.serving.metrics import GatewayMetrics
from gateway.serving.session import Session, Timings
from omnistream.audio.listener import AudioArrival
from omnistream.request.generation import DoneEvent, GenerationRequest, TextEvent


class _NoCore:
    async def open(self, request, trace=None):
        raise AssertionError("a response cancelled before it began must not reach the stages")


def test_a_response_cancelled_before_its_task_ran_still_sends_response_done():
    async def run() -> tuple[list[dict], list[str]]:
        sent: list[str] = []

        async def send(text: str) -> None:
            sent.append(text)

        outbound = Outbound(send)
        ended: list[str] = []

        async def on_end(response: ResponseRun) -> None:
            ended.append(response.status)

        item = Item("item_1", "assistant", [], [{"type": "output_audio"}], status="in_progress")
        request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], return_audio=True)
        response = ResponseRun(_NoCore(), Protocol(beta=False), outbound, request, item, None, on_end)
        response.start()
        assert await response.cancel("client_cancelled")  # in the same loop turn: the task never ran
        sender = asyncio.create_task(outbound.run())
        await outbound.drain(5)
        outbound.close()
        sender.cancel()
        return [json.loads(t) for t in sent], ended

    events, ended = asyncio.run(run())
    kinds = [e["type"] for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.done", kinds
    assert events[-1]["response"]["status"] == "cancelled"
    assert ended == ["cancelled"]


def _response(session: Session | None) -> ResponseRun:
    async def send(text: str) -> None:
        pass

    async def on_end(response: ResponseRun) -> None:
        pass

    item = Item("item_1", "assistant", [], [{"type": "output_audio"}], status="in_progress")
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], return_audio=True)
    response = ResponseRun(_NoCore(), Protocol(beta=False), Outbound(send), request, item, None, on_end)
    response.session = session
    return response


def _session(timings: Timings) -> Session:
    async def body(emit):
        raise AssertionError("not run")

    session = Session(GatewayMetrics(), lambda _: None, "r", None, [], body, 0.0)  # type: ignore[arg-type]
    session.timings = timings
    return session


def test_response_done_carries_the_listeners_stalls():
    # 0.1 s at 24 kHz handed out at 1.0, then 0.2 s at 16 kHz at 1.25 (0.15 s stall), 0.1 s at 1.5
    # (0.05 s stall): 2 stalls, 200 ms in all, the longest 150 ms, continuity lost.
    chunks = [
        AudioArrival(1.0, 2400, 24_000),
        AudioArrival(1.25, 3200, 16_000),
        AudioArrival(1.5, 2400, 24_000),
    ]
    t = Timings(0.0, first_text=0.5, first_audio=1.0, last_audio=1.5, audio_seconds=0.4, audio_chunks=chunks)
    extra = _response(_session(t)).describe()["omnistream"]
    assert extra["stalls"] == 2 and extra["stall_ms"] == 200.0 and extra["underrun_ms"] == 200.0
    assert extra["longest_stall_ms"] == 150.0 and extra["continuity_ok"] is False
    assert extra["ttfa_ms"] == 1000.0


def test_a_turn_without_audio_has_no_listener_numbers():
    for session in (None, _session(Timings(0.0, first_text=0.5))):
        extra = _response(session).timings()
        assert all(extra[k] is None for k in ("stalls", "stall_ms", "underrun_ms", "continuity_ok"))


class _Said:
    """A session whose answer comes as these text events, then ends."""

    def __init__(self, *deltas: tuple[list[int], str]) -> None:
        self.deltas = deltas
        self.replica_addresses: dict[str, str] = {}

    async def events(self):
        for ids, delta in self.deltas:
            yield TextEvent(ids, delta)
        output = [i for ids, _ in self.deltas for i in ids]
        yield DoneEvent([1, 2], output, "length", 0, 0, 0.01, None, 0.02)


def test_response_done_counts_the_tokens_that_came_before_and_with_the_first_text():
    async def tokens_at_first_text(session: _Said) -> int | None:
        response = _response(None)
        await response._deltas(session)  # type: ignore[arg-type]
        return response.timings()["tokens_at_first_text"]

    # A byte of an unfinished character says nothing until the next token completes (or breaks) it.
    held = _Said(([244], ""), ([449], "\ufffd one"), ([12], " two"))
    assert asyncio.run(tokens_at_first_text(held)) == 2
    assert asyncio.run(tokens_at_first_text(_Said(([5], "Hi"), ([6], " there")))) == 1
    assert asyncio.run(tokens_at_first_text(_Said(([5, 6], "Hi there")))) == 2  # one chunk of two
    assert asyncio.run(tokens_at_first_text(_Said(([7, 8], ""), ([9], "")))) is None  # no text at all
