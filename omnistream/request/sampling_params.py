"""The sampling knobs of a request, and their bounds: shared by the gateway and the engines.

Torch-free on purpose: the gateway validates and forwards these without loading torch; only an
engine asks for the request's `torch.Generator`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from omnistream.request.errors import InvalidRequest

if TYPE_CHECKING:
    import torch


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
        """The request's own random stream (None when greedy); only engines call it."""
        if self.greedy:
            return None
        import torch  # here, not at the top: the gateway uses these params without torch

        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen
