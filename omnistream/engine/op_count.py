"""Count the aten ops a piece of code dispatches, split by graph-capturable region.

On a GPU every eager op costs the host ~5-10 us to launch whatever its size, so on a small model a
step's time is its op count times that. A `TorchDispatchMode` sees every op after autograd (views,
copies, factories and in-place updates included), on any device, so the count taken on this CPU
is the count a GPU would launch. Ops dispatched inside `omnistream.engine.capture.capturable(...)` are
counted as `inside` (one graph replay each region, once captured); the rest as `outside`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from omnistream.engine import capture


@dataclass
class OpCounts:
    """Ops of one counted piece of code: inside and outside capturable regions, and by name."""

    inside: int = 0
    outside: int = 0
    outside_ops: Counter[str] = field(default_factory=Counter)  # op name -> count, outside regions

    @property
    def total(self) -> int:
        return self.inside + self.outside

    def as_dict(self) -> dict[str, int]:
        return {"total": self.total, "inside": self.inside, "outside": self.outside}


class OpCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's mode base is untyped
    """`with OpCounter() as counter:` counts every aten op dispatched in the block (`counter.counts`)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counts = OpCounts()

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if capture.inside():
            self.counts.inside += 1
        else:
            self.counts.outside += 1
            self.counts.outside_ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))
