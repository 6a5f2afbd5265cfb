"""The seed of each draw of a sampled request: a pure function of (the request's seed, the step).

A request that draws from one random stream can only be repeated from its first draw. Keyed by its
step instead, the draw of token n is the same whether the request ran to n in one go or was resumed
at n on another replica after its first one was lost (issue 62): the thinker re-opened there with the
answer so far continues exactly as the uninterrupted run would have. The talker keys its frames'
draws alike (a frame a step).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def step_seed(seed: int, step: int, stream: int = 0) -> int:
    """A 64-bit seed for draw `step` of a request seeded `seed` (BLAKE2b of them: unrelated streams
    for neighbouring steps and seeds); `stream` tells apart a request's streams that draw at the same
    steps (the talker's codebook 0 and its code predictor's residuals, one frame a step)."""
    key = seed.to_bytes(8, "little") + step.to_bytes(8, "little") + stream.to_bytes(1, "little")
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def keyed(generator: torch.Generator | None, seed: int, step: int, stream: int = 0) -> torch.Generator | None:
    """`generator` (None: a greedy row) seeded for draw `step` of `stream`: what the row's sampler
    draws from for that step."""
    if generator is not None:
        generator.manual_seed(step_seed(seed, step, stream))
    return generator


def request_seed(seed: int | None) -> int:
    """The request's own seed, or one chosen here when it gave none (a stage API caller; the gateway
    gives every sampled request one, so that a resume elsewhere draws the same)."""
    return seed if seed is not None else secrets.randbits(63)
