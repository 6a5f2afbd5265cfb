"""The engine's output channel: bounded, ordered, and never waking the engine under its own lock."""

from __future__ import annotations

import asyncio

import pytest

from omnistream.engine.engine import Engine, RequestState
from omnistream.engine.output_stream import OutputStream


def test_consumer_wakes_the_engine_without_holding_the_stream_lock():
    # The engine thread holds its condition and then asks `has_room()` (the stream lock); the
    # consumer must therefore call back into the engine only after releasing the stream lock,
    # or the two threads deadlock (seen as a request stuck until its timeout).
    async def run() -> list[bool]:
        free: list[bool] = []
        stream: OutputStream[int] = OutputStream(
            asyncio.get_running_loop(),
            8,
            on_consume=lambda: free.append(
                stream._lock.acquire(blocking=False) and (stream._lock.release() or True)
            ),
        )
        for i in range(3):
            stream.put(i)
        assert await stream.get() == 0
        assert await stream.get_batch() == [1, 2]
        return free

    free = asyncio.run(run())
    assert free and all(free)


def test_items_then_close_then_none_and_errors_surface():
    async def run():
        stream: OutputStream[int] = OutputStream(asyncio.get_running_loop(), 2)
        stream.put(1)
        assert stream.has_room()  # capacity 2, one item: room left
        stream.put(2)
        assert not stream.has_room()
        stream.close()
        assert [x async for x in stream] == [1, 2]
        failing: OutputStream[int] = OutputStream(asyncio.get_running_loop(), 2)
        failing.fail(RuntimeError("boom"))
        with pytest.raises(RuntimeError, match="boom"):
            await failing.get()
        closed: OutputStream[int] = OutputStream(asyncio.get_running_loop(), 2)
        closed.close()
        closed.fail(RuntimeError("late"))  # a finished request ignores late failures
        assert await closed.get() is None

    asyncio.run(run())


class _Counter(Engine):
    """Each step puts the next number for every request until it has three."""

    name = "counter"

    def _schedule(self, candidates):
        work = [s for s in candidates if not s.finished and s.output.has_room()]
        return work or None

    def _run(self, work) -> None:
        for state in work:
            state.sent = getattr(state, "sent", 0) + 1
            state.output.put(state.sent)
            if state.sent == 3:
                self.finish(state)


def _one_request_to_its_end(engine: Engine) -> list:
    """Start `engine` with one request, collect its outputs to the end, stop the engine."""

    async def run() -> list:
        state = RequestState("r", engine.new_output())
        engine.admit(state)
        engine.start()
        return [item async for item in state.output]

    try:
        return asyncio.run(asyncio.wait_for(run(), 30))
    finally:
        engine.stop()


def test_a_failing_step_listener_does_not_end_the_engine_thread():
    engine = _Counter(max_requests=2)
    calls: list[int] = []

    def broken(engine_, seconds) -> None:
        calls.append(1)
        raise AttributeError("a metrics hook bug")

    engine.add_step_listener(broken)

    assert _one_request_to_its_end(engine) == [1, 2, 3]
    assert len(calls) >= 3


def _steps_and_hand_offs(monkeypatch, engine_class: type[_Counter]) -> list[str]:
    """Run one request through `engine_class` on its thread: "step" per step, "let go" per zero sleep."""
    import omnistream.engine.engine as engine_module

    seen: list[str] = []
    real_sleep = engine_module.time.sleep

    def sleep(seconds: float) -> None:
        if seconds == 0:
            seen.append("let go")
        real_sleep(seconds)

    class Recorded(engine_class):  # type: ignore[misc, valid-type]
        def _run(self, work) -> None:
            seen.append("step")
            super()._run(work)

    monkeypatch.setattr(engine_module.time, "sleep", sleep)
    assert _one_request_to_its_end(Recorded(max_requests=1)) == [1, 2, 3]
    return seen


def _let_go_after(seen: list[str]) -> list[bool]:
    """For each step, whether the engine let go of the GIL before the next step began."""
    steps = [i for i, what in enumerate(seen) if what == "step"]
    return [seen[i + 1 : i + 2] == ["let go"] for i in steps]


def test_the_engine_thread_lets_go_of_the_gil_after_every_step(monkeypatch):
    # What a step put out is sent by the event loop's thread, which needs the GIL: the engine lets go
    # of it once a step (a zero sleep), before it plans the next, so that a first token does not wait
    # for the second (docs/benchmarks.md, "The first token leaves at once").
    seen = _steps_and_hand_offs(monkeypatch, _Counter)
    assert _let_go_after(seen) == [True, True, True], seen


def test_an_engine_that_hands_off_when_asked_lets_go_after_a_first_output_and_when_asked(monkeypatch):
    # The thinker's text may leave a few steps together (at concurrency 10 a message a step and
    # request cost its pace); a request's first output still leaves at once, and so does what the
    # engine says a client waits for (`hand_off`).
    class WhenAsked(_Counter):
        hand_off_every_step = False

        def _run(self, work) -> None:
            super()._run(work)
            if any(s.sent == 3 for s in work):
                self.hand_off()

    seen = _steps_and_hand_offs(monkeypatch, WhenAsked)
    assert _let_go_after(seen) == [True, False, True], seen
