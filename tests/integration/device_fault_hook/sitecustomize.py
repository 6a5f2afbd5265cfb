"""Test hook: a stage that raises a fake CUDA fault on demand (never loaded by the services alone).

tests/integration/test_stage_device_fault.py starts a stage with PYTHONPATH=<this directory> and
OMNISTREAM_TEST_DEVICE_FAULT=FILE; Python imports this file as `sitecustomize` at startup. Once FILE
exists, every engine step raises the RuntimeError torch gives an illegal memory access, as a real
poisoned CUDA context does, so the real process's reaction (fail, NOT_SERVING, exit) is what runs.
"""

from __future__ import annotations

import os

_TRIGGER = os.environ.get("OMNISTREAM_TEST_DEVICE_FAULT")

if _TRIGGER:
    from omnistream.engine.engine import Engine

    _start = Engine.start

    def _start_with_fault(self: Engine) -> None:
        run = self._run

        def run_or_fault(work):
            if os.path.exists(_TRIGGER):
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return run(work)

        self._run = run_or_fault  # type: ignore[method-assign]
        _start(self)

    Engine.start = _start_with_fault  # type: ignore[method-assign]
