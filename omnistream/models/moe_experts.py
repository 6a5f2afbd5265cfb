"""Mixture-of-experts blocks whose decode step makes no host sync: fixed shapes, device-side routing.

transformers ships three experts implementations, and in a decode step each of them stops the host
or breaks a CUDA graph somewhere: `eager` loops over the experts a batch hit (`nonzero`, a Python
loop, a `bool` per expert); `grouped_mm` is sync-free only on its CUTLASS path (bfloat16 on an
SM90/SM100 GPU), and elsewhere ATen's fallback copies the group offsets to the host (`offs.cpu()`:
the "Cannot copy between CPU and CUDA tensors during CUDA graph capture" of the talker's greedy
decode steps on the first GPU run, which were float32); `batched_mm` copies one expert's weights per
(token, expert) pair, 3x the weight traffic of reading them once as soon as a batch grows.

`fixed_experts_forward` (registered as `FIXED`) keeps every shape a function of the batch's row
count alone, so a step is capturable and its routing never reaches the host:

- few (token, expert) pairs (`3 * pairs < experts`, e.g. batch 1-5 of 128 experts, top-8): each
  pair's two matrix-vector products on its gathered weights (`index_select` + `bmm`);
- more pairs: every expert on every row (`matmul` over the stacked weights), then each row's `top_k`
  outputs gathered: the weights are read once, in place, whatever the batch, and once the pairs hit
  most experts that is what the sparse kernels read too (compute is cheap next to it in a decode).

Each row's `top_k` outputs are weighted and summed as transformers' `batched_mm` and `grouped_mm`
sum them. A prefill (more than `FIXED_MAX_ROWS` rows) is not a captured step and runs the sparse
`grouped_mm` (every expert on every row would be `experts / top_k` times its work), or, in float64,
which that kernel refuses, the dense path. Equal to `eager` up to rounding (tests hold tokens and codes
equal in float64 and float32, tests/unit/models/test_moe_experts.py and the reference builds).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, grouped_mm_experts_forward

FIXED = "omnistream_fixed"
# Rows above which a block is a prefill's: the largest decode batch served (64) with room to spare.
FIXED_MAX_ROWS = 128


def fixed_experts_forward(
    self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts' output [rows, hidden] for `hidden_states` [rows, hidden] routed to
    `top_k_index` [rows, k] with `top_k_weights` [rows, k]; `self` is a transformers experts module
    (`gate_up_proj` [E, 2I, H], `down_proj` [E, H, I], `_apply_gate`)."""
    rows, top_k = top_k_index.shape
    if rows > FIXED_MAX_ROWS and hidden_states.dtype != torch.float64:
        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    if 3 * rows * top_k < self.num_experts:
        picked = _pairs(self, hidden_states, top_k_index)
    else:
        picked = _every_expert(self, hidden_states, top_k_index)
    weighted = picked * top_k_weights.unsqueeze(-1).to(picked.dtype)
    return weighted.sum(dim=1).to(hidden_states.dtype)


def _pairs(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
    """[rows, k, hidden]: each (row, expert) pair through its expert's gathered weights."""
    rows, top_k = top_k_index.shape
    hidden = hidden_states.shape[-1]
    ids = top_k_index.reshape(-1)
    x = hidden_states.unsqueeze(1).expand(rows, top_k, hidden).reshape(rows * top_k, hidden, 1)
    gate_up = torch.bmm(self.gate_up_proj.index_select(0, ids), x).squeeze(-1)  # [S, 2I]
    inner = self._apply_gate(gate_up).unsqueeze(-1)  # [S, I, 1]
    out = torch.bmm(self.down_proj.index_select(0, ids), inner).squeeze(-1)  # [S, H]
    return out.view(rows, top_k, hidden)


def _every_expert(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> torch.Tensor:
    """[rows, k, hidden]: every expert on every row, then each row's chosen experts gathered."""
    rows, top_k = top_k_index.shape
    hidden = hidden_states.shape[-1]
    gate_up = torch.matmul(hidden_states, self.gate_up_proj.transpose(1, 2))  # [E, rows, 2I]
    inner = self._apply_gate(gate_up)  # [E, rows, I]
    out = torch.matmul(inner, self.down_proj.transpose(1, 2))  # [E, rows, H]
    index = top_k_index.unsqueeze(-1).expand(rows, top_k, hidden)
    return out.transpose(0, 1).gather(1, index)


def experts_for(requested: str, device: torch.device, dtype: torch.dtype, dims: tuple[int, ...]) -> str:
    """The `experts_implementation` a stage loads with: `requested` (fixed, grouped_mm, eager) or,
    for auto, one whose decode step waits for no device: `grouped_mm` on the CPU (there is no device
    to wait for) and where its CUTLASS kernel runs (`dims`: the expert matrices' sizes), `FIXED`
    everywhere else and in float64 (which `grouped_mm` refuses)."""
    if requested != "auto":
        return FIXED if requested == "fixed" else requested
    if dtype == torch.float64:
        return FIXED
    if device.type == "cpu" or _cutlass_grouped_mm(device, dtype, dims):
        return "grouped_mm"
    return FIXED


def _cutlass_grouped_mm(device: torch.device, dtype: torch.dtype, dims: tuple[int, ...]) -> bool:
    """ATen's sync-free grouped GEMM: bfloat16 on SM90/SM100 with 16-byte aligned rows (ATen's
    GroupedBlas.cpp); anything else takes its fallback, which reads the offsets on the host."""
    if device.type != "cuda" or dtype != torch.bfloat16 or any(d % 8 for d in dims):
        return False
    if not (hasattr(torch.nn.functional, "grouped_mm") or hasattr(torch, "_grouped_mm")):
        return False
    return torch.cuda.get_device_capability(device)[0] in (9, 10)


def register() -> None:
    """Make `FIXED` a valid `experts_implementation` for `from_pretrained` (idempotent)."""
    if FIXED not in ALL_EXPERTS_FUNCTIONS:
        ALL_EXPERTS_FUNCTIONS.register(FIXED, fixed_experts_forward)
