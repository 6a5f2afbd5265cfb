"""Next-token choice shared by the autoregressive stages.

Mirrors the order of Hugging Face's logits processors (repetition penalty, suppressed tokens, then
temperature, top-k, top-p) so that a greedy run reproduces `generate` exactly and a sampled run uses
the same knobs. Each request owns a `torch.Generator`, so a seeded request draws the same tokens
whether it runs alone or batched with others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omnistream.errors import InvalidRequest


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 means off
    repetition_penalty: float = 1.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self, prefix: str = "") -> SamplingParams:
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequest(f"{prefix}temperature must be in [0, 100]", field=f"{prefix}temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest(f"{prefix}top_p must be in (0, 1]", field=f"{prefix}top_p")
        if not 0 <= self.top_k <= 100_000:
            raise InvalidRequest(f"{prefix}top_k must be in [0, 100000]", field=f"{prefix}top_k")
        if not 0.0 < self.repetition_penalty <= 10.0:
            raise InvalidRequest(
                f"{prefix}repetition_penalty must be in (0, 10]", field=f"{prefix}repetition_penalty"
            )
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise InvalidRequest(f"{prefix}seed must be in [0, 2^63)", field=f"{prefix}seed")
        return self

    def generator(self, device: str | torch.device = "cpu") -> torch.Generator | None:
        if self.greedy:
            return None
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen


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
