"""What a model's mixture-of-experts blocks do that a GPU would wait for, recorded on the CPU.

On this CPU-only machine nothing waits, so the recorder names the causes instead: while any
`*SparseMoeBlock` forward runs it records the aten ops that read device values on the host or give a
shape that depends on them (`nonzero`, `item`, `unique`, a boolean-mask index, ...), tensors made
from host data (`lift_fresh`: `torch.tensor(...)` inside the step), and the Python calls that hand a
tensor's value to Python (`.tolist()`, `bool(t)`, ...). `grouped_mm` is recorded too: whether it
waits depends on the device and dtype (ATen's fallback copies its offsets to the host), so a caller
allows it only where the project selects it knowing that.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that read a value on the host or make a value-dependent shape.
SYNC_OPS = {
    "aten.nonzero",
    "aten.nonzero_static",
    "aten._local_scalar_dense",
    "aten.item",
    "aten.is_nonzero",
    "aten.equal",
    "aten.unique",
    "aten._unique",
    "aten._unique2",
    "aten.unique_dim",
    "aten.unique_consecutive",
    "aten.masked_select",
    "aten.bincount",
    "aten.lift_fresh",
    "aten._grouped_mm",
}
INDEX_OPS = {"aten.index", "aten.index_put", "aten.index_put_"}
PY_SYNCS = ("item", "tolist", "__int__", "__bool__", "__float__", "__index__", "cpu", "numpy")


class MoeSyncs(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's mode base is untyped
    """`with MoeSyncs(model) as syncs:` records in `syncs.found` what the model's MoE blocks did
    that waits for a device; `syncs.blocks` counts the MoE forwards seen (so a test knows it ran)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.model = model
        self.found: Counter[str] = Counter()
        self.blocks = 0
        self._depth = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._depth:
            name = str(func.overloadpacket)
            if name in SYNC_OPS:
                self.found[name] += 1
            elif name in INDEX_OPS and _bool_index(args):
                self.found[f"{name} (boolean mask)"] += 1
        return func(*args, **(kwargs or {}))

    @contextlib.contextmanager
    def _scoped(self) -> Iterator[None]:
        hooks = []
        for module in self.model.modules():
            if type(module).__name__.endswith("SparseMoeBlock"):
                hooks.append(module.register_forward_pre_hook(self._enter))
                hooks.append(module.register_forward_hook(self._leave))
        saved = [(name, getattr(torch.Tensor, name)) for name in PY_SYNCS]
        for name, fn in saved:
            setattr(torch.Tensor, name, self._watch(name, fn))
        try:
            yield
        finally:
            for name, fn in saved:
                setattr(torch.Tensor, name, fn)
            for hook in hooks:
                hook.remove()

    def _enter(self, *_args) -> None:
        self._depth += 1
        self.blocks += 1

    def _leave(self, *_args) -> None:
        self._depth -= 1

    def _watch(self, name, fn):
        def watched(tensor, *args, **kwargs):
            if self._depth:
                self.found[f"Tensor.{name}"] += 1
            return fn(tensor, *args, **kwargs)

        return watched

    def __enter__(self):
        self._scope = self._scoped()
        self._scope.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._scope.__exit__(*exc)


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())
