"""Next-token choice shared by the autoregressive stages.

Mirrors the order of Hugging Face's logits processors (repetition penalty, suppressed tokens, then
temperature, top-k, top-p) so that a greedy run reproduces `generate` exactly and a sampled run uses
the same knobs. Each request owns a `torch.Generator`, so a seeded request draws the same tokens
whether it runs alone or batched with others (the thinker seeds it for each token from the request's
seed and the token's index, the talker for each frame, omnistream/engine/step_seeds.py, so a resumed
answer draws the same too).

The engines choose through `omnistream.engine.batch_sampler.BatchSampler` (one batched pass per step, no
host syncs); `choose` stays as the per-row reference it is held to, bit for bit
(tests/unit/engine/test_batch_sampler.py).
"""

from __future__ import annotations

import torch

from omnistream.request.sampling_params import SamplingParams

__all__ = ["SamplingParams", "apply_repetition_penalty", "choose"]


def apply_repetition_penalty(logits: torch.Tensor, previous: list[int], penalty: float) -> torch.Tensor:
    """HF's RepetitionPenaltyLogitsProcessor for one row."""
    if penalty == 1.0 or not previous:
        return logits
    idx = torch.tensor(sorted(set(previous)), dtype=torch.long, device=logits.device)
    score = logits.gather(-1, idx)
    score = torch.where(score < 0, score * penalty, score / penalty)
    return logits.scatter(-1, idx, score)


def choose(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    previous: list[int] | None = None,
    suppress: torch.Tensor | None = None,
) -> int:
    """Pick the next token from one row of logits ([vocab])."""
    logits = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    logits = apply_repetition_penalty(logits, previous or [], params.repetition_penalty)
    if suppress is not None:
        logits = logits.masked_fill(suppress, float("-inf"))
    if params.greedy:
        return int(torch.argmax(logits).item())
    logits = logits / params.temperature
    if params.top_k > 0:
        k = min(params.top_k, logits.shape[-1])
        kth = torch.topk(logits, k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= (1 - params.top_p)
        remove_sorted[-1] = False  # keep at least one
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    probs = logits.softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())
