"""The batched sampler against the per-row `choose` it replaces: same ids, same random streams."""

from __future__ import annotations

import random

import pytest
import torch

from omnistream.engine.batch_sampler import BatchSampler, RowSampling, draw_noise
from omnistream.engine.sampling import choose
from omnistream.request.sampling_params import SamplingParams

KNOBS = [
    SamplingParams(),  # greedy
    SamplingParams(temperature=0.7, seed=1),
    SamplingParams(temperature=1.0, top_k=50, top_p=0.8, seed=2),
    SamplingParams(temperature=1.3, top_k=5, seed=3),
    SamplingParams(temperature=0.9, top_p=0.5, repetition_penalty=1.3, seed=4),
    SamplingParams(repetition_penalty=1.5),  # greedy with a penalty
    SamplingParams(temperature=2.0, top_k=1, repetition_penalty=0.8, seed=5),
    SamplingParams(temperature=1.0, top_p=0.95, top_k=10_000, seed=6),
]


def test_multinomial_is_argmax_of_probs_over_exponential_noise():
    """What the sampler relies on: ATen's one-sample multinomial draw, reproduced op for op."""
    for seed in range(20):
        probs = torch.randn(3000).softmax(-1)
        probs[torch.rand(3000) < 0.3] = 0
        g = torch.Generator().manual_seed(seed)
        want = int(torch.multinomial(probs, 1, generator=g).item())
        g2 = torch.Generator().manual_seed(seed)
        noise = torch.empty_like(probs).exponential_(1, generator=g2)
        assert int(torch.argmax(probs / noise)) == want
        assert torch.equal(g.get_state(), g2.get_state())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [512, 3072])
def test_batch_equals_per_row_choose(dtype, vocab):
    rnd = random.Random(vocab)
    knobs = KNOBS * 2
    batch = len(knobs)
    suppress = torch.zeros(vocab, dtype=torch.bool)
    suppress[vocab - 100 :] = True
    # Two streams per row: one for the batched sampler, one for `choose`; same seed, same draws.
    new_gen = [p.generator() for p in knobs]
    old_gen = [p.generator() for p in knobs]
    for p, a, b in zip(knobs, new_gen, old_gen, strict=True):
        if a is not None and p.seed is None:
            b.set_state(a.get_state())
    sampler = BatchSampler(vocab, slots=batch + 3, suppress=suppress)
    slot_of = list(range(3, batch + 3))  # rows are not slots
    history = [[rnd.randrange(vocab) for _ in range(rnd.randrange(0, 30))] for _ in range(batch)]
    for row, slot in enumerate(slot_of):
        sampler.reset(slot, history[row])
    slots = torch.tensor(slot_of)
    rows = [RowSampling(p, g) for p, g in zip(knobs, new_gen, strict=True)]
    torch.manual_seed(vocab)
    for _ in range(25):
        # Scaled so that top-p cuts inside the distribution; bf16 brings many ties.
        logits = (torch.randn(batch, vocab) * 4).to(dtype)
        got = sampler.sample(logits, rows, slots).tolist()
        want = [
            choose(logits[i], p, old_gen[i], previous=history[i], suppress=suppress)
            for i, p in enumerate(knobs)
        ]
        assert got == want
        for i, token in enumerate(want):
            history[i].append(token)
    # The presence masks hold exactly the histories.
    for row, slot in enumerate(slot_of):
        assert sorted(sampler.presence[slot].nonzero().flatten().tolist()) == sorted(set(history[row]))


def test_all_greedy_and_no_penalty_needs_no_slots():
    sampler = BatchSampler(64)
    logits = torch.randn(4, 64)
    got = sampler.sample(logits, [RowSampling(SamplingParams())] * 4)
    assert got.tolist() == logits.argmax(-1).tolist()


def test_penalty_without_presence_is_refused():
    sampler = BatchSampler(64)
    with pytest.raises(ValueError, match="presence"):
        sampler.sample(torch.randn(1, 64), [RowSampling(SamplingParams(repetition_penalty=1.2))])


def test_reset_forgets_the_previous_request():
    sampler = BatchSampler(16, slots=2)
    sampler.reset(1, [3, 4])
    sampler.reset(1, [5])
    assert sampler.presence[1].nonzero().flatten().tolist() == [5]


def test_noise_drawn_beforehand_gives_the_successive_draws():
    """`draw_noise` fills each sampled row's noise for several steps at once; on the CPU those are
    the numbers the same number of `sample` calls draw one by one, so the ids are the same and
    each generator ends in the same state. Greedy rows draw nothing."""
    vocab, draws = 700, 5
    rows_a = [RowSampling(p, p.generator("cpu")) for p in KNOBS]
    rows_b = [RowSampling(p, p.generator("cpu")) for p in KNOBS]
    logits = [
        torch.randn(len(KNOBS), vocab, generator=torch.Generator().manual_seed(d)) for d in range(draws)
    ]
    sampler = BatchSampler(vocab, slots=len(KNOBS))
    slots = torch.arange(len(KNOBS))
    knobs = sampler.prepare(rows_a)
    one_by_one = [sampler.sample(x, knobs, slots) for x in logits]
    sampler = BatchSampler(vocab, slots=len(KNOBS))
    noise = torch.empty(len(KNOBS), draws, vocab)
    draw_noise(rows_b, noise)
    beforehand = [
        sampler.sample(x, sampler.prepare(rows_b), slots, noise=noise[:, d]) for d, x in enumerate(logits)
    ]
    assert all(torch.equal(a, b) for a, b in zip(one_by_one, beforehand, strict=True))
    for a, b in zip(rows_a, rows_b, strict=True):
        if a.generator is not None:
            assert torch.equal(a.generator.get_state(), b.generator.get_state())
    assert torch.equal(noise[0], torch.ones(draws, vocab))  # the greedy row
