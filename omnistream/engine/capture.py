"""Graph-capturable regions: the parts of an engine step that are fixed-shape, device-only work.

A CUDA graph replays a recorded sequence of kernels with the same shapes at the same addresses; it
cannot contain a host sync (`.item()`, `.tolist()`), a data-dependent shape or branch, a tensor made
from host values, or a draw from a per-request generator. Code inside `capturable(name)` promises
exactly that: given its static inputs, it could be captured once (per batch bucket) and replayed.
Everything a step dispatches outside such a region is host work between replays, paid op by op on
a GPU; `omnistream/engine/op_count.py` counts the two apart, so that promise is measured, not assumed.

The marker itself costs one thread-local increment and decrement: it stays in the step code.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_state = threading.local()


@contextlib.contextmanager
def capturable(name: str) -> Iterator[None]:
    """Mark the body as a graph-capturable region (`name` says which, for readers and traces)."""
    depth = getattr(_state, "depth", 0)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth = depth


def inside() -> bool:
    """True while this thread runs inside a capturable region."""
    return getattr(_state, "depth", 0) > 0
