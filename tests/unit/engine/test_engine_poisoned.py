"""A device fault ends the engine: every request fails explicitly, nothing new is admitted, and the
fatal listeners hear of it once; an ordinary step error still fails only its request."""

from __future__ import annotations

import asyncio
import threading

import pytest

from omnistream.engine.engine import Engine, RequestState
from omnistream.request.errors import InternalError, Unavailable

FAULT = RuntimeError("CUDA error: an illegal memory access was encountered")


class _Faulty(Engine):
    """Steps its requests one at a time; a request named `fault`/`bad` raises the given error."""

    name = "faulty"

    def _schedule(self, candidates):
        ready = [s for s in candidates if not s.finished]
        return ready or None

    def _run(self, work):
        for state in work:
            if state.request_id.startswith("fault"):
                raise FAULT
            if state.request_id.startswith("bad"):
                raise ValueError("this request's own problem")
            state.output.put(state.request_id)
            self.finish(state)

    def add(self, rid: str):
        state = RequestState(request_id=rid, output=self.new_output())
        self.admit(state)
        return state.output


def test_a_device_fault_fails_every_request_stops_the_engine_and_tells_the_listener():
    async def run():
        engine = _Faulty(max_requests=8)
        heard = []
        done = threading.Event()
        engine.add_fatal_listener(lambda error: (heard.append(error), done.set()))
        faulty = engine.add("fault-1")  # first in the step: the others have not run yet
        waiting = [engine.add(f"w{i}") for i in range(3)]
        engine.start()
        assert await asyncio.to_thread(done.wait, 10)
        for out in [*waiting, faulty]:
            # Nothing of theirs ran: each gets the explicit error, none hangs.
            with pytest.raises(Unavailable, match="lost its device"):
                await out.get()
        assert heard == [FAULT] and engine.poisoned is FAULT
        with pytest.raises(Unavailable):
            engine.add("late")
        await asyncio.to_thread(engine.stop)
        assert not engine.running and engine.num_requests == 0

    asyncio.run(run())


def test_an_ordinary_error_fails_its_request_alone_and_the_engine_goes_on():
    async def run():
        engine = _Faulty(max_requests=8)
        engine.add_fatal_listener(lambda error: pytest.fail(f"not fatal: {error}"))
        engine.start()
        try:
            with pytest.raises(InternalError):
                await engine.add("bad-1").get()
            assert await engine.add("ok").get() == "ok"
            assert engine.poisoned is None
        finally:
            await asyncio.to_thread(engine.stop)

    asyncio.run(run())
