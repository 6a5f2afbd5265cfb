"""vLLM's greedy tokens for token-id prompts on a converted thinker: the check of the conversion.

`python -m omnistream.models.qwen3_omni.thinker.vllm_greedy --model CHECKPOINT --max-tokens N` with the vLLM
environment's python reads JSON from stdin, a list of batches (each a list of prompts, each a list
of token ids), runs each batch as one `LLM.generate` call (the prompts of a batch share vLLM's
steps: continuous batching, prompts of different lengths in one step), and prints one line, `MARK`
and JSON: the generated ids per batch and prompt. The tests compare them with the transformers thinker's.

The engine settings are the serving ones that matter for the numbers (float32, eager, token ids
in and out, vLLM's own defaults elsewhere) and `ignore_eos`, so every prompt runs `max_tokens`.
vLLM spawns its engine process: this runs only as `__main__`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from omnistream.models.qwen3_omni.thinker.vllm_launch import CPU_KVCACHE_GIB

MARK = "vllm-greedy: "  # the result line's prefix (vLLM logs to stdout too)


def greedy(
    model: str, batches: list[list[list[int]]], max_tokens: int, max_model_len: int
) -> list[list[list[int]]]:
    from vllm import LLM, SamplingParams

    from omnistream.models.qwen3_omni.thinker.vllm_checkpoint import ensure_converted

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KVCACHE_GIB)
    llm = LLM(
        model=str(ensure_converted(model)),
        dtype="float32",
        enforce_eager=True,
        skip_tokenizer_init=True,
        generation_config="vllm",
        max_model_len=max_model_len,
        max_num_seqs=max(len(b) for b in batches),
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False)
    out: list[list[list[int]]] = []
    for batch in batches:
        results = llm.generate([{"prompt_token_ids": p} for p in batch], params, use_tqdm=False)
        out.append([list(r.outputs[0].token_ids) for r in results])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="the Qwen3-Omni checkpoint (converted on first use)")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=1024)
    args = p.parse_args(argv)
    batches = json.loads(sys.stdin.read())
    result = greedy(args.model, batches, args.max_tokens, args.max_model_len)
    print(MARK + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
