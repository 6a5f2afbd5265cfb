"""The request bookkeeping every stage engine shares: admission under the request limit, abort, a
request's end (finished or failed), a lost device failing them all, the engine's counters and its
step and fatal listeners.

`RequestBook` is the base class of both kinds of engine: the step-loop engine (engine.py, whose
scheduler thread reads the book under its condition) and the vLLM thinker
(models/qwen3_omni/thinker/vllm_engine.py, whose book lives on the event loop). A request is
refused, aborted, ended and failed the same way, with the same errors, whichever backend serves it.
What differs between them is in the hooks: `_guard` (the lock the book is read and changed under),
`_admitted`, `_retire`, `_aborted` and `_on_poison` (what the engine does beside the book),
`_running` (which requests hold model state), and the messages of a lost device.
"""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, TypeVar

from omnistream.engine.api import FatalListener, StepListener
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.stats import EngineStats
from omnistream.request.errors import InvalidRequest, OmniError, Overloaded, Unavailable

log = logging.getLogger(__name__)


class BookedRequest(Protocol):
    """What the book needs of a request: its id, its output channel, and whether it ended."""

    request_id: str
    output: OutputStream[Any]
    finished: bool


R = TypeVar("R", bound=BookedRequest)


class RequestBook(Generic[R]):
    """The requests an engine holds (`_requests`, in arrival order) and what ends them.

    An engine sets the book's fields in its constructor (`RequestBook.__init__`); the methods here
    are the engine API's bookkeeping part (omnistream/engine/api.py, `StageEngine`)."""

    name = "engine"
    # Unavailable's messages once the device is lost: refusing a new request, failing a running one
    # (`{name}`: the engine's; `{error}`: the type of the error that poisoned it).
    lost_refusal = "{name} lost its device and is restarting"
    lost_failure = "{name} lost its device ({error}); it is restarting"

    max_requests: int
    stats: EngineStats
    # Set once the device is lost (device_errors.py; vLLM's engine core died): the engine then
    # fails everything, stops, and tells its fatal listeners (the server exits non-zero).
    poisoned: BaseException | None
    _requests: dict[str, R]
    _stopping: bool
    _step_listeners: list[StepListener]
    _fatal_listeners: list[FatalListener]

    def __init__(self, max_requests: int) -> None:
        self.max_requests = max_requests
        self.stats = EngineStats()
        self.poisoned = None
        self._requests = {}
        self._stopping = False
        self._step_listeners = []
        self._fatal_listeners = []

    # --- the engine's hooks -----------------------------------------------------------------------
    def _guard(self) -> AbstractContextManager[Any]:
        """What the book is read and changed under: nothing (one thread, the event loop's), unless
        the engine has a thread of its own."""
        return contextlib.nullcontext()

    def _admitted(self, state: R) -> None:
        """Under the guard: `state` was just added."""

    def _retire(self, state: R) -> None:
        """Under the guard: `state` ended (finished, failed or aborted; never poisoned)."""

    def _aborted(self, state: R) -> None:
        """Under the guard: `state` was aborted (after `_retire`; its output closes next)."""

    def _on_poison(self, states: list[R]) -> None:
        """Under the guard: the device was lost, `states` (every request) are failed next."""

    def _running(self, state: R) -> bool:
        """Does `state` hold model state (`counts`' running, else waiting)?"""
        raise NotImplementedError

    def _report_poisoned(self, error: BaseException, count: int) -> None:
        log.critical(
            "%s: the device is poisoned (%s); failing %d request(s) and stopping",
            self.name,
            error,
            count,
            exc_info=error,
        )

    # --- admission ----------------------------------------------------------------------------------
    def check_admission(self, request_id: str) -> None:
        """Raise what refuses a new request `request_id` right now (a lost device, a stopping engine,
        a running id, the request limit), before the engine builds it."""
        with self._guard():
            self._refuse(request_id)

    def _refuse(self, request_id: str) -> None:
        if self.poisoned is not None:
            raise Unavailable(self.lost_refusal.format(name=self.name))
        if self._stopping:
            raise Overloaded(f"{self.name} engine is stopping")
        if request_id in self._requests:
            raise InvalidRequest(f"request {request_id!r} is already running", field="request_id")
        if len(self._requests) >= self.max_requests:
            raise Overloaded(f"{self.name} engine is at its limit of {self.max_requests} requests")

    def admit(self, state: R) -> None:
        """Add a built request (the subclass's `add_request` checked it), under the request limit."""
        with self._guard():
            self._refuse(state.request_id)
            self._requests[state.request_id] = state
            self._admitted(state)

    # --- the end of a request -----------------------------------------------------------------------
    def abort(self, request_id: str, output: OutputStream[Any] | None = None) -> bool:
        """Forget the request now (its model-side resources go as the engine sees fit: `_retire`,
        `_aborted`).

        With `output`, only the request that owns that output is aborted: a stream that ends late
        never aborts a newer request that reuses its id.
        """
        with self._guard():
            state = self._requests.get(request_id)
            if state is None or (output is not None and state.output is not output):
                return False
            del self._requests[request_id]
            state.finished = True
            self._retire(state)
            self.stats.aborted += 1
            self._aborted(state)
        state.output.close()
        return True

    def finish(self, state: R) -> None:
        """The request ended once its terminal output is queued (called by the engine and its parts)."""
        with self._guard():
            if self._requests.get(state.request_id) is state:
                del self._requests[state.request_id]
                self.stats.finished += 1
            state.finished = True
            self._retire(state)
        state.output.close()

    def fail(self, state: R, error: OmniError) -> None:
        """End the request with `error`."""
        with self._guard():
            if self._requests.get(state.request_id) is state:
                del self._requests[state.request_id]
            state.finished = True
            self._retire(state)
            self.stats.errors += 1
        state.output.fail(error)

    def _poison(self, error: BaseException) -> None:
        """The device is unusable: fail every request with an explicit error (Unavailable), stop the
        engine and tell the fatal listeners, once. Nothing is retired: that would touch the device
        again, and the process is about to end."""
        with self._guard():
            if self.poisoned is not None:
                return
            self.poisoned = error
            self._stopping = True
            states = list(self._requests.values())
            self._requests.clear()
            for state in states:
                state.finished = True
            self.stats.errors += len(states)
            self._on_poison(states)
        self._report_poisoned(error, len(states))
        for state in states:
            state.output.fail(
                Unavailable(self.lost_failure.format(name=self.name, error=type(error).__name__))
            )
        for listener in self._fatal_listeners:
            try:
                listener(error)
            except Exception:
                log.exception("%s: a fatal listener failed", self.name)

    # --- what the engine holds ----------------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        with self._guard():
            return len(self._requests)

    def has_request(self, request_id: str) -> bool:
        with self._guard():
            return request_id in self._requests

    def request_ids(self) -> list[str]:
        with self._guard():
            return list(self._requests)

    def state(self, request_id: str) -> R:
        """The running request's state (tests, tools: what the engine holds for it); KeyError if none."""
        with self._guard():
            return self._requests[request_id]

    def states(self) -> list[R]:
        """Every running request's state, in arrival order."""
        with self._guard():
            return list(self._requests.values())

    def counts(self) -> tuple[int, int]:
        """(running, waiting) right now: running holds model state, waiting waits for a slot or input."""
        with self._guard():
            running = sum(1 for s in self._requests.values() if self._running(s))
            return running, len(self._requests) - running

    # --- listeners ----------------------------------------------------------------------------------
    def _stepped(self, seconds: float) -> None:
        """A step ended after `seconds`: counted, and the step listeners told."""
        self.stats.steps += 1
        self.stats.last_step_seconds = seconds
        for listener in self._step_listeners:
            try:
                listener(self, seconds)
            except Exception:  # a metrics hook must never end the engine's stepping
                log.exception("%s step listener %r failed", self.name, listener)

    def add_fatal_listener(self, listener: FatalListener) -> None:
        """`listener(error)` runs once, when the device is lost (on the engine thread, or for the
        vLLM thinker on the event loop)."""
        self._fatal_listeners.append(listener)

    def add_step_listener(self, listener: StepListener) -> None:
        """`listener(engine, seconds)` runs after each step (metrics hook): on the engine thread, or
        for the vLLM thinker on the event loop."""
        self._step_listeners.append(listener)

    def remove_step_listener(self, listener: StepListener) -> None:
        """Stop calling `listener` after steps (a test's or a tool's clock)."""
        self._step_listeners.remove(listener)
