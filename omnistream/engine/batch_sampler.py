"""Next-token choice for a whole batch in one pass over [B, V] logits, without host syncs.

The per-row `omnistream.engine.sampling.choose` costs one `.item()` and about ten small kernels per row,
and its repetition penalty rebuilds the request's whole history on the host every token. Here a
step's knobs go to the device in one copy, every row is processed by the same batched kernels
(rows may mix greedy and sampled, and differ in temperature, top-k, top-p and penalty), and the
chosen ids come back in one copy.

It reproduces `choose` bit for bit, seeded draws included, because it performs the same element
operations in the same order (Hugging Face's: repetition penalty, suppressed tokens, temperature,
top-k, top-p) and draws like `torch.multinomial(probs, 1, generator=g)`, which ATen implements as
`argmax(probs / q)` with `q = empty_like(probs).exponential_(1, generator=g)`: each sampled row
draws its own noise from its own generator (one kernel per row, no sync) and the argmax is batched.
`tests/unit/engine/test_batch_sampler.py` holds it to `choose`.

The repetition penalty reads a device-side presence mask per slot ([slots, V] bool), set from the
prompt once and updated with the chosen ids on the device, so no history crosses to the host.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from omnistream.request.sampling_params import SamplingParams


@dataclass(frozen=True)
class RowSampling:
    """One batch row's knobs and its request's random stream (None when greedy)."""

    params: SamplingParams
    generator: torch.Generator | None = None


class BatchSampler:
    """Chooses one id per row of [B, V] logits; owns the presence masks of `slots` requests."""

    def __init__(
        self,
        vocab: int,
        device: str | torch.device = "cpu",
        slots: int = 0,
        suppress: torch.Tensor | None = None,
    ) -> None:
        self.vocab = vocab
        self.device = torch.device(device)
        # Seen ids per slot, for the repetition penalty (only allocated when slots are asked for).
        self.presence = torch.zeros((slots, vocab), dtype=torch.bool, device=self.device) if slots else None
        self.suppress = suppress

    # --- presence masks -----------------------------------------------------------------------------
    def reset(self, slot: int, seen: Sequence[int] | torch.Tensor = ()) -> None:
        """A new request in `slot`: forget the last one's ids, remember `seen` (e.g. its prompt)."""
        assert self.presence is not None, "this sampler keeps no presence masks"
        self.presence[slot] = False
        if len(seen):
            ids = torch.as_tensor(seen, dtype=torch.long).to(self.device, non_blocking=True)
            self.presence[slot, ids] = True

    # --- one step -----------------------------------------------------------------------------------
    def prepare(self, rows: Sequence[RowSampling], device: str | torch.device | None = None) -> StepKnobs:
        """The rows' knobs on the device, in one host -> device copy (pinned on CUDA). A caller that
        samples the same rows several times per step (the code predictor's 15 groups) prepares once."""
        params = [r.params for r in rows]
        device = torch.device(device) if device is not None else self.device
        knobs = None
        penalized = any(p.repetition_penalty != 1.0 for p in params)
        sampled = [not p.greedy for p in params]
        if penalized or any(sampled):
            # float64 keeps each value exact until the on-device cast, which rounds like the Python
            # scalars `choose` hands to float32 ops.
            host = torch.tensor(
                [
                    [
                        p.repetition_penalty,
                        p.temperature if not p.greedy else 1.0,
                        min(p.top_k, self.vocab) if p.top_k > 0 and not p.greedy else 0,
                        1 - p.top_p if not p.greedy else 0.0,
                        float(not p.greedy),
                    ]
                    for p in params
                ],
                dtype=torch.float64,
            )
            if device.type == "cuda":
                host = host.pin_memory()
            knobs = host.to(device, non_blocking=True)
        live = [p for p, s in zip(params, sampled, strict=True) if s]
        return StepKnobs(
            rows=list(rows),
            knobs=knobs,
            penalized=penalized,
            sampled=sampled,
            max_top_k=max((min(p.top_k, self.vocab) for p in live), default=0),
            top_p=any(p.top_p < 1.0 for p in live),
        )

    def sample(
        self,
        logits: torch.Tensor,
        rows: Sequence[RowSampling] | StepKnobs,
        slots: torch.Tensor | None = None,
        noise: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Chosen ids [B] (long, on the logits' device; no sync). `slots` (long [B], on the device)
        names each row's presence mask: needed when any row has a repetition penalty, and then the
        chosen ids are added to those masks. `noise` ([B, V], from `draw_noise`): the rows' draws,
        made beforehand, so this call has no per-row op and no generator (graph-capturable)."""
        step = rows if isinstance(rows, StepKnobs) else self.prepare(rows, logits.device)
        if logits.dim() != 2 or logits.shape[0] != len(step.rows) or logits.shape[1] != self.vocab:
            raise ValueError(f"logits must be [{len(step.rows)}, {self.vocab}], got {tuple(logits.shape)}")
        logits = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
        knobs = step.knobs
        if step.penalized:
            if slots is None or self.presence is None:
                raise ValueError("a repetition penalty needs the rows' slots and presence masks")
            assert knobs is not None
            penalty = knobs[:, 0:1].to(logits.dtype)
            seen = self.presence.index_select(0, slots)
            scaled = torch.where(logits < 0, logits * penalty, _divide(logits, penalty))
            logits = torch.where(seen, scaled, logits)
        if self.suppress is not None:
            logits = logits.masked_fill(self.suppress, float("-inf"))
        chosen = torch.argmax(logits, dim=-1)
        if any(step.sampled):
            assert knobs is not None
            picked = self._draw(logits, step, noise)
            chosen = torch.where(knobs[:, 4] > 0, picked, chosen)
        if step.penalized:
            assert self.presence is not None and slots is not None
            # A device tensor of Trues, not a Python True: that would be a host scalar copied in,
            # which a CUDA graph cannot capture (seen on an H200: the talker's batched frames ran eagerly).
            self.presence.index_put_((slots, chosen), torch.ones_like(chosen, dtype=torch.bool))
        return chosen

    def _draw(self, logits: torch.Tensor, step: StepKnobs, noise: torch.Tensor | None = None) -> torch.Tensor:
        """Temperature, top-k, top-p, then one draw per sampled row (greedy rows get a dummy)."""
        knobs = step.knobs
        assert knobs is not None
        logits = _divide(logits, knobs[:, 1:2].to(logits.dtype))
        if step.max_top_k > 0:
            k_index = knobs[:, 2].long()
            values = torch.topk(logits, step.max_top_k, dim=-1).values
            kth = values.gather(-1, (k_index - 1).clamp(min=0).unsqueeze(-1))
            kth = torch.where(k_index.unsqueeze(-1) > 0, kth, torch.full_like(kth, float("-inf")))
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if step.top_p:
            threshold = knobs[:, 3:4].to(logits.dtype)
            sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            remove_sorted = (cumulative <= threshold) & (threshold > 0)
            remove_sorted[:, -1] = False  # keep at least one
            remove = remove_sorted.scatter(-1, order, remove_sorted)
            logits = logits.masked_fill(remove, float("-inf"))
        probs = logits.softmax(-1)
        if noise is None:
            noise = torch.ones_like(probs)
            for row, state in enumerate(step.rows):
                if step.sampled[row]:
                    noise[row].exponential_(1, generator=state.generator)
        return torch.argmax(probs / noise, dim=-1)


def draw_noise(rows: Sequence[RowSampling], out: torch.Tensor) -> None:
    """Fill `out` [>= B, draws, vocab] with the noise of `draws` consecutive samplings of each row:
    each sampled row's generator fills its [draws, vocab] at once (one kernel a row, not one a row
    and draw), greedy and padding rows get ones. On the CPU this is bitwise the noise `draws`
    successive `BatchSampler.sample` calls draw (the CPU kernel fills element by element from the
    generator); on CUDA the same distribution from the same seed, but not the same numbers."""
    out.fill_(1.0)
    for row, state in enumerate(rows):
        if not state.params.greedy:
            out[row].exponential_(1, generator=state.generator)


@dataclass
class StepKnobs:
    """One step's rows with their knobs on the device (see `BatchSampler.prepare`)."""

    rows: list[RowSampling]
    knobs: torch.Tensor | None  # [B, 5] float64: penalty, temperature, top_k, 1 - top_p, sampled
    penalized: bool
    sampled: list[bool]
    max_top_k: int
    top_p: bool


def _divide(x: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
    """`x / divisor` rounded like `x / python_float` is on x's device: ATen's CUDA kernel
    multiplies by the scalar's reciprocal, its CPU kernel divides (float32)."""
    if x.device.type == "cuda":
        return x * divisor.reciprocal()
    return x / divisor
