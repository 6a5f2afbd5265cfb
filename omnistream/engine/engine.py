"""The generic part of a stage engine: a scheduler thread over the request bookkeeping every engine
shares (`requests.RequestBook`; each request's output channel is `output_stream.OutputStream`).

Model forwards run in one worker thread (torch releases the GIL), so the asyncio side (gRPC, the
in-process pipeline) keeps flowing while the model computes. The asyncio side only touches
thread-safe entry points (`add`, `feed`, `abort`); results come back through a bounded
`OutputStream` per request. A request whose output is full, or whose next input has not arrived,
is skipped for that step: it never blocks the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from omnistream.engine.device_errors import poisons_device
from omnistream.engine.output_stream import OutputStream
from omnistream.engine.prefix_cache import PrefixCache
from omnistream.engine.requests import RequestBook
from omnistream.request.errors import InternalError, OmniError

log = logging.getLogger(__name__)


@dataclass
class RequestState:
    """What every engine keeps per request; engines subclass it."""

    request_id: str
    output: OutputStream[Any]
    arrived: float = field(default_factory=time.monotonic)
    slot: int | None = None
    finished: bool = False
    suspicions: int = 0  # batched steps that failed with this request in them
    # Background work (a transcription): stepped only when no other request can (`_next_work`).
    background: bool = False

    @property
    def held_slot(self) -> int:
        """The KV slot of a request the schedule gave one (what a step's forward runs it in)."""
        assert self.slot is not None, f"request {self.request_id!r} holds no slot"
        return self.slot


T = TypeVar("T")


def present(value: T | None) -> T:
    """`value`, which the engine's own order guarantees is set by now (a step's inputs)."""
    assert value is not None
    return value


# A request in a batch that failed is retried alone this many times before it is failed itself.
MAX_SUSPICIONS = 2


# A subclass's per-request state and the work one of its steps runs (what `_schedule` returns).
S = TypeVar("S", bound=RequestState)
W = TypeVar("W")


class Engine(RequestBook[S], Generic[S, W]):
    """Base class: subclasses implement `_schedule` (pick work, under the lock) and `_run` (compute).

    Generic in the subclass's request state `S` and its step's work `W`, so what `_schedule` returns is
    what `_run` gets, typed. `max_batch` is the subclass's (its KV slots, a step's rows). The request
    bookkeeping (admit, abort, finish, fail, a poisoned device) is `RequestBook`'s, read and changed
    under the engine's condition."""

    name = "engine"
    max_batch: int
    # An engine with prefix caching sets its cache here (omnistream/engine/prefix_cache.py): the
    # scopes that end are released on the engine thread, between steps.
    prefix_cache: PrefixCache | None = None
    # Let the event loop have the GIL after every step (see `_loop`), or only after a step that
    # called `hand_off` (a request's first output, or what the subclass says the client waits for).
    hand_off_every_step = True

    def __init__(self, max_requests: int, output_capacity: int = 256) -> None:
        super().__init__(max_requests)
        self.output_capacity = output_capacity
        self._cond = threading.Condition()
        self._released: list[S] = []  # ended requests, their model-side resources freed next step
        self._hand_off_due = False
        self._thread: threading.Thread | None = None
        self._suspects: deque[S] = deque()  # retried alone after their batch failed

    # --- the request book's hooks ---------------------------------------------------------------------
    def _guard(self) -> AbstractContextManager[Any]:
        return self._cond

    def _admitted(self, state: S) -> None:
        self._cond.notify_all()

    def _retire(self, state: S) -> None:
        self._released.append(state)  # its KV slot is released before the next step

    def _aborted(self, state: S) -> None:
        self._cond.notify_all()

    def _on_poison(self, states: list[S]) -> None:
        self._suspects.clear()
        self._cond.notify_all()

    def _running(self, state: S) -> bool:
        return state.slot is not None

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"{self.name}-engine", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        """Is the engine thread started (and not stopped)?"""
        return self._thread is not None

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    # --- asyncio-side entry points (`admit` and `abort`: the request book's) ------------------------
    def new_output(self) -> OutputStream[Any]:
        """A request's output channel on the running event loop; consuming from it wakes the engine."""
        return OutputStream(
            asyncio.get_running_loop(), self.output_capacity, on_consume=self.wake, on_first_put=self.hand_off
        )

    def hand_off(self) -> None:
        """Let the event loop have the GIL once this step ends (engine thread): what the step put out
        leaves at once, not with the next steps' outputs."""
        self._hand_off_due = True

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def release_cache_scope(self, scope: bytes) -> None:
        """Any thread: a prefix cache scope ended (a realtime session closed); its blocks go before
        the engine's next step."""
        if self.prefix_cache is not None:
            self.prefix_cache.request_release(scope)
            self.wake()

    # --- one step on the caller's thread (tests, tools; the engine thread is not started) ------------
    def plan_step(self) -> W | None:
        """What the engine thread does before a step: release what ended, then pick the work."""
        with self._cond:
            self._release_ended()
            return self._next_work()

    def run_step(self, work: W) -> None:
        """Run one step's work (what `plan_step` returned; the engine thread runs each step through
        here, under `torch.inference_mode`, which a caller on its own thread holds as it likes)."""
        self._run(work)

    def release_ended(self) -> None:
        """Free the model-side resources of ended requests now (the engine thread does it each step)."""
        with self._cond:
            self._release_ended()

    def _release_ended(self) -> None:
        released, self._released = self._released, []
        for state in released:
            self._release(state)

    # --- engine thread (`finish` and `fail`: the request book's) -------------------------------------
    def _release(self, state: S) -> None:
        """Free the model-side resources of a finished or aborted request (engine thread)."""

    def _schedule(self, candidates: list[S]) -> W | None:
        """Under the lock: the work for one step among `candidates` (in arrival order), or None
        when none can progress."""
        raise NotImplementedError

    @contextlib.contextmanager
    def row(self, state: S) -> Iterator[None]:
        """Per-request work after a batched forward (sampling, emitting): a failure there is that
        request's alone, so it fails only that request and the rest of the batch carries on."""
        try:
            yield
        except OmniError as exc:
            self.fail(state, exc)
        except Exception as exc:
            if poisons_device(exc):  # not this request's fault, and no request can go on
                self._poison(exc)
                return
            log.exception("%s: request %s failed", self.name, state.request_id)
            self.fail(state, InternalError(f"{self.name} failed on this request: {exc}"))

    def _run(self, work: W) -> None:
        """Outside the lock: run one step of model work."""
        raise NotImplementedError

    def _work_states(self, work: W) -> list[S]:
        """The requests a failed step's batch held (each then retried alone)."""
        states: list[S] = list(work)  # type: ignore[call-overload]  # the default work: an iterable of states
        return states

    def _deferred(self, count: int) -> None:
        """Under the lock, from `_schedule`: `count` requests that could have stepped wait for this
        step's more urgent ones (the stage's deferred-steps metric)."""
        self.stats.last_deferred = count
        self.stats.deferred += count

    def _next_work(self) -> W | None:
        """Under the lock: a suspect alone while there are any, else the normal batch."""
        self.stats.last_deferred = 0  # what `_schedule` reports is about the step it returns
        self.stats.last_buffered = ()
        while self._suspects:
            state = self._suspects.popleft()
            if state.finished or self._requests.get(state.request_id) is not state:
                continue
            work = self._schedule([state])
            if work is not None:
                return work
            # It cannot step right now (waits for input or room): it rejoins the batch later.
        states = list(self._requests.values())
        foreground = [s for s in states if not s.background]
        if len(foreground) == len(states):
            return self._schedule(states)
        # Background requests never share a step with the others, so they never make one longer:
        # they step only when nothing else can (what waits for its input, or a slot they hold, lets
        # them finish and free it).
        work = self._schedule(foreground) if foreground else None
        if work is None:
            work = self._schedule([s for s in states if s.background])
        return work

    def _step_failed(self, work: W, error: Exception) -> None:
        """A step raised. Alone, the request caused it: fail it. In a batch, the culprit is unknown:
        every member is retried alone (the forward left no trace: lengths advance only after it),
        so only the one that fails again alone is failed and the innocent ones carry on.
        An error that poisons the device ends every request and the engine (see `_poison`)."""
        self._states_failed(self._work_states(work), error)

    def _states_failed(self, states: list[S], error: Exception) -> None:
        """`_step_failed` for the requests of a forward: subclasses call it with one request for a
        forward that ran it alone (a prefill piece), which fails it at once."""
        if poisons_device(error):
            self._poison(error)
            return
        states = [s for s in states if not s.finished]
        if not isinstance(error, OmniError):
            log.exception("%s step failed (%d request(s))", self.name, len(states), exc_info=error)
        for state in states:
            state.suspicions += 1
            if len(states) == 1 or state.suspicions > MAX_SUSPICIONS:
                if isinstance(error, OmniError):
                    self.fail(state, error)
                else:
                    self.fail(state, InternalError(f"{self.name} step failed: {error}"))
            else:
                with self._cond:
                    self._suspects.append(state)

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._cond:
                while True:
                    self._release_ended()
                    if self.prefix_cache is not None:
                        self.prefix_cache.apply_releases()
                    if self._stopping:
                        return
                    work = self._next_work()
                    if work is not None:
                        break
                    self._cond.wait(timeout=1.0)
            started = time.perf_counter()
            self.stats.last_batch_size = 0
            self.stats.last_units = 0
            self.stats.last_prefill_rows = 0
            try:
                with torch.inference_mode():
                    self.run_step(work)
            except Exception as exc:  # a failed step ends the request that caused it, never the engine
                self._step_failed(work, exc)
            self._stepped(time.perf_counter() - started)
            # Let go of the GIL (a zero sleep), so that the event loop, woken for what the step put
            # out, sends it now. Without it the loop thread waited for the next step to let go: a
            # thinker's first chunk left with its second to fourth token, 3-10 ms late, in ~1 of 7
            # spoken turns (docs/benchmarks.md, "The first token leaves at once"). An engine whose
            # later outputs may go a few steps together (the thinker's text) does it only when asked.
            if self.hand_off_every_step or self._hand_off_due:
                self._hand_off_due = False
                time.sleep(0)
