"""CUDA graphs of fixed-shape engine steps: captured on first use per key, checked, dropped on doubt.

A step whose shapes depend only on its key (a batch bucket, a width, a variant) and whose device
work sits in `capture.capturable` regions can be recorded once into a CUDA graph and replayed: one
launch instead of hundreds. Graphs are on by default on CUDA, so they must never change a result:

- the first capture of a key runs the step eagerly on the same (static) inputs, captures it, replays
  the graph once and compares every output with the eager run's, bit for bit;
- a graph that fails to capture or replays other values is dropped for that key (logged once) and
  the step runs eagerly from then on: a graph can cost speed, never change a step's values.

The check runs the step more than once on the same inputs (eager, warm-up, capture, replay), so a
step must be idempotent: it may write only what it recomputes the same way each time (outputs,
staging buffers), or name the tensors it reads and then changes (`mutated`: saved before the check
and restored before each later run). Capture is in the thread-local mode: another engine's thread
may launch work on the same device meanwhile (the in-process pipeline), which the global mode turns
into "operation not permitted when stream is capturing" in that thread (seen on an H200).

Used by the talker's static frame (omnistream/models/qwen3_omni/talker/frame.py) and Code2Wav's
streaming step (omnistream/models/qwen3_omni/code2wav/static_step.py). `record` and `device` are
hooks, so the safeguards run on the CPU in tests with a fake graph (never a pretended CUDA one).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import torch

log = logging.getLogger(__name__)

# A step's output: one tensor or a tuple of them (compared one by one).
Out = TypeVar("Out", torch.Tensor, tuple[torch.Tensor, ...])


def outputs_equal(
    a: torch.Tensor | tuple[torch.Tensor, ...], b: torch.Tensor | tuple[torch.Tensor, ...]
) -> bool:
    """Every tensor of `a` equals `b`'s, shapes and values (NaN never equals: such a graph is dropped)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _cloned(out: Out) -> Out:
    if isinstance(out, torch.Tensor):
        return out.clone()
    return tuple(t.clone() for t in out)


class StepGraphs:
    """Per key, a checked CUDA graph of a step (or None: the key runs eagerly); see the module doc.

    `record(step) -> (graph, out)` captures a step (default: `capture`, on CUDA) and `device()` is
    the context a replay runs in (default: `current_device`); both are replaceable, for tests."""

    def __init__(
        self,
        name: str,
        device: torch.device,
        warmup_runs: int,
        record: Callable[[Callable[[], Any]], tuple[Any, Any]] | None = None,
        device_context: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.name = name  # says whose graphs in the logs ("talker frame", "code2wav step")
        self.device = device
        self.warmup_runs = warmup_runs
        self.record = record or self.capture
        self.device_context = device_context or self.current_device
        # Per key: the graph and its output, or (None, _) where the key runs eagerly.
        self.graphs: dict[Hashable, tuple[Any, Any]] = {}
        self._pool: Any = None

    def run(self, key: Hashable, step: Callable[[], Out], mutated: Sequence[torch.Tensor] = ()) -> Out:
        """`step()`'s result: the replay of its graph for `key`, captured and checked on first use,
        or the eager step where that graph was dropped. `mutated`: what the step reads and changes
        (restored before every run of the first capture's check)."""
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._checked_record(key, step, mutated)
            if entry[0] is not None:
                out: Out = entry[1]
                return out  # the check's replay is this step's result
        graph, captured = entry
        if graph is None:
            return step()
        with self.device_context():
            graph.replay()
        result: Out = captured
        return result

    def _checked_record(
        self, key: Hashable, step: Callable[[], Out], mutated: Sequence[torch.Tensor]
    ) -> tuple[Any, Any]:
        """A graph of `step` whose first replay equals the eager step, else (None, _): eager."""
        saved = [m.clone() for m in mutated]

        def restore() -> None:
            for tensor, before in zip(mutated, saved, strict=True):
                tensor.copy_(before)

        try:
            expected = _cloned(step())
            restore()
            graph, out = self.record(step)
            restore()
            with self.device_context():
                graph.replay()
            if not outputs_equal(out, expected):
                log.error(
                    "%s: the graph of %s replays other values than its eager step; it runs eagerly",
                    self.name,
                    key,
                )
                restore()  # the eager step that runs instead starts from them too
                return None, torch.empty(0)
            return graph, out
        except Exception:
            log.exception("%s: capturing %s failed; it runs eagerly", self.name, key)
            restore()
            return None, torch.empty(0)

    def capture(self, step: Callable[[], Any]) -> tuple[Any, Any]:
        """Warm the step up on a side stream, then capture it into one graph (all in one pool)."""
        with self.current_device():
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            side = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(self.warmup_runs):
                    step()
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # Thread-local: see the module doc.
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                out = step()
        log.info("%s: captured a CUDA graph (%d so far)", self.name, len(self.graphs) + 1)
        return graph, out

    def current_device(self) -> contextlib.AbstractContextManager[Any]:
        """The step's CUDA device made current (a no-op context off CUDA)."""
        return torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
