"""A response stopped before its task first ran still ends with response.done (status cancelled)."""

from __future__ import annotations

import asyncio
import json

from gateway.realtime.outbound import Outbound
from gateway.realtime.protocol import Protocol
from gateway.realtime.response import ResponseRun
from gateway.realtime.session import Item
from omnistream.request import GenerationRequest


class _NoCore:
    async def open(self, request):
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
