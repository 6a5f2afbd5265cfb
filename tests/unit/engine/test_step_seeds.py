"""Each draw's seed (omnistream/engine/step_seeds.py): a pure function of the request's seed and the
step, distinct for neighbouring steps and seeds, within what torch.Generator.manual_seed takes."""

from __future__ import annotations

import torch

from omnistream.engine.step_seeds import request_seed, step_seed


def test_a_step_seed_depends_on_the_seed_and_the_step_alone():
    assert step_seed(7, 3) == step_seed(7, 3)
    seeds = {step_seed(seed, step) for seed in range(50) for step in range(50)}
    assert len(seeds) == 2500
    assert all(0 <= s < 2**64 for s in seeds)
    torch.Generator().manual_seed(max(seeds))  # the largest is a seed torch takes


def test_a_request_without_a_seed_gets_one_of_its_own():
    assert request_seed(5) == 5
    chosen = {request_seed(None) for _ in range(20)}
    assert len(chosen) == 20 and all(0 <= s < 2**63 for s in chosen)
