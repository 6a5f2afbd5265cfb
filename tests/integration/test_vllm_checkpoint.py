"""vLLM, loading the thinker's text model as a Qwen3MoeForCausalLM directory
(thinker/vllm_checkpoint.py), makes the transformers thinker's greedy tokens, alone and in one batch
of prompts of different lengths: a vLLM process in its own environment (.venv-vllm). The conversion's
own checks are tests/unit/models/qwen3_omni/thinker/test_vllm_checkpoint.py.
"""

from __future__ import annotations

import json
import subprocess

from omnistream.models.qwen3_omni.thinker import vllm_greedy
from tests.vllm_env import VLLM_PYTHON, requires_vllm
from tests.vllm_reference import MAX_TOKENS, prompts, transformers_greedy


@requires_vllm
def test_vllm_greedy_equals_transformers_alone_and_batched(tiny_model_dir):
    batch = prompts(tiny_model_dir)
    want = transformers_greedy(tiny_model_dir, batch)
    batches = [[batch[1]], [batch[3]], batch]  # two alone, then all four in one batch
    run = subprocess.run(
        [
            VLLM_PYTHON,
            "-m",
            "omnistream.models.qwen3_omni.thinker.vllm_greedy",
            "--model",
            tiny_model_dir,
            "--max-tokens",
            str(MAX_TOKENS),
        ],
        input=json.dumps(batches),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    (line,) = [line for line in run.stdout.splitlines() if line.startswith(vllm_greedy.MARK)]
    got = json.loads(line[len(vllm_greedy.MARK) :])
    assert got[0] == [want[1]]
    assert got[1] == [want[3]]
    assert got[2] == want
