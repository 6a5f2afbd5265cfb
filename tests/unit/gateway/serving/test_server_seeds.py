"""ServerSeeds: which requests get a chosen seed, and that a fixed setting gives the same request
the same seed, another request another."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np

from gateway.serving.server_seeds import ServerSeeds, content_seed
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import AudioInput
from omnistream.request.sampling_params import SamplingParams

SAMPLED = SamplingParams(temperature=0.9)
GREEDY = SamplingParams()


def request(
    thinker: SamplingParams = SAMPLED, talker: SamplingParams = SAMPLED, **fields
) -> GenerationRequest:
    return GenerationRequest(prompt_ids=[1, 2], sampling=thinker, talker_sampling=talker, **fields)


def spoken(samples: np.ndarray, **fields) -> GenerationRequest:
    part = {"type": "input_audio", "audio": AudioInput(samples=samples, sample_rate=16000)}
    return GenerationRequest(
        messages=[{"role": "user", "content": [part]}], sampling=SAMPLED, talker_sampling=SAMPLED, **fields
    )


def apply(seeds: ServerSeeds, given: GenerationRequest) -> GenerationRequest:
    return asyncio.run(seeds.apply(given))


def test_an_unseeded_sampled_request_gets_one_seed_for_both_stages_and_is_not_changed_in_place() -> None:
    for setting in (None, 5):
        given = request()
        chosen = apply(ServerSeeds(setting), given)
        assert chosen.sampling.seed is not None and chosen.sampling.seed == chosen.talker_sampling.seed
        assert 0 <= chosen.sampling.seed < 2**63 and chosen.sampling.temperature == 0.9
        assert given.sampling.seed is None and given.talker_sampling.seed is None


def test_seeds_a_client_gave_and_greedy_stages_are_left_alone() -> None:
    seeds = ServerSeeds(None)
    seeded = request(SamplingParams(temperature=0.9, seed=3), SamplingParams(temperature=0.9, seed=4))
    assert apply(seeds, seeded) is seeded
    greedy = request(GREEDY, GREEDY)
    assert apply(seeds, greedy) is greedy
    text_only = request(GREEDY, SAMPLED, return_audio=False)  # its talker never runs
    assert apply(seeds, text_only) is text_only
    talker_only = apply(seeds, request(GREEDY, SAMPLED))
    assert talker_only.sampling.seed is None and talker_only.talker_sampling.seed is not None
    thinker_only = apply(seeds, request(SAMPLED, SamplingParams(temperature=0.9, seed=4)))
    assert thinker_only.sampling.seed is not None and thinker_only.talker_sampling.seed == 4


def test_without_a_setting_every_request_gets_a_fresh_seed() -> None:
    seeds = ServerSeeds(None)
    assert apply(seeds, request()).sampling.seed != apply(seeds, request()).sampling.seed


def test_with_a_setting_the_seed_is_the_request_s_content_s() -> None:
    samples = np.linspace(-1, 1, 1600, dtype=np.float32)
    base = spoken(samples)
    seed = content_seed(5, base)
    # The same content, built again (a new array, another gateway, another order): the same seed.
    assert apply(ServerSeeds(5), spoken(samples.copy())).sampling.seed == seed
    assert content_seed(5, spoken(samples, cache_scope=b"a session's secret", refer_audio=True)) == seed
    # Anything the answer depends on: another seed.
    louder = samples.copy()
    louder[7] += 1e-6
    others = [
        spoken(louder),
        spoken(samples.astype(np.float64)),
        spoken(samples.reshape(2, -1)),
        spoken(samples, max_tokens=12),
        spoken(samples, speaker="chelsie"),
        spoken(samples, tools=[{"type": "function", "function": {"name": "f"}}]),
        dataclasses.replace(base, sampling=SamplingParams(temperature=0.8)),
    ]
    assert len({seed, *(content_seed(5, o) for o in others)}) == len(others) + 1
    assert content_seed(6, base) != seed
