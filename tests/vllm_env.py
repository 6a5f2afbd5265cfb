"""The optional vLLM environment the vLLM thinker tests need (`make setup-vllm` builds .venv-vllm).

Those tests run under the project's python and reach vLLM only through processes started with the
vLLM environment's interpreter (a thinker service, the greedy helper), because vLLM pins an older
transformers than the project's. Without the environment they are skipped with `SKIP_REASON`, and
the session's summary says so in one line (tests/conftest.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from omnistream.models.qwen3_omni.thinker.vllm_launch import vllm_python_default

VLLM_PYTHON = os.environ.get("OMNISTREAM_VLLM_PYTHON") or str(vllm_python_default())
# The environment's own stamp too: a half-built one (make setup-vllm still running) has a python.
HAVE_VLLM = os.access(VLLM_PYTHON, os.X_OK) and (Path(VLLM_PYTHON).parents[1] / ".installed").exists()
SKIP_REASON = f"vLLM thinker tests: no vLLM environment at {VLLM_PYTHON} (run `make setup-vllm`)"

requires_vllm = pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)
