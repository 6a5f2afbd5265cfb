"""Answers through the gateway, REST (as a user's client) and gRPC, against the transformers
reference on both tiny builds: the same tokens and the same audio, to the sample, however the
answer ends (tests/reference_runs.py; issue 34: answers that ended by themselves were one frame,
1,920 samples, longer than the reference's)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnistream.audio.wav import to_pcm16
from omnistream.client import AsyncRestClient, Client, RestClient
from tests.reference_runs import CASES, chat_prompt_ids, runs_for

from .conftest import gateway_process, gateway_url

AUDIO_ATOL = float(np.spacing(np.float32(1)))  # float64 engines ship float32 samples


# The never-ending build's answers all run to their limits (the costly ones): `make test-slow`.
@pytest.fixture(scope="module", params=["ending", pytest.param("never-ending", marks=pytest.mark.slow)])
def build_gateway(request, references, build_dirs):
    """(name, model dir, gateway, reference): a gateway of its own over the session's stages."""
    name = request.param
    stages = request.getfixturevalue({"never-ending": "stages", "ending": "ending_stages"}[name])
    with gateway_process(stages) as gateway:
        yield name, build_dirs(name), gateway, references(name)


def _check_pcm16(audio: np.ndarray, wav: np.ndarray, label) -> None:
    """REST's pcm16 is the reference's samples rounded to 16 bits: one step apart at most (our
    float32 samples may round the other way where the reference's lie on a half step)."""
    assert audio.shape == wav.shape, label
    ours = np.frombuffer(to_pcm16(audio), "<i2").astype(np.int32)
    theirs = np.frombuffer(to_pcm16(wav), "<i2").astype(np.int32)
    assert np.abs(ours - theirs).max() <= 1, label


@pytest.mark.parametrize("case", list(CASES))
def test_rest_and_grpc_answers_match_reference(build_gateway, case):
    """REST and the gateway's gRPC API: the reference's tokens (gRPC; REST's token count) and audio
    (gRPC to float32 rounding, REST to pcm16's), async and sequential, both schedules across the
    cases."""
    name, model_dir, gateway, reference = build_gateway
    ref = reference.run(chat_prompt_ids(model_dir, CASES[case].messages), CASES[case])
    options = CASES[case].options()
    for mode, schedule in runs_for(name, case, outer=True):
        label = (name, case, mode, schedule)
        run = {**options, "async_chunk": mode == "async", "codec_chunk_schedule": schedule}
        with Client(gateway.address) as client:
            answer = client.complete(CASES[case].messages, **run)
        assert answer.token_ids == ref.tokens, label
        assert answer.audio.shape == ref.wav.shape, label
        np.testing.assert_allclose(answer.audio, ref.wav, rtol=0, atol=AUDIO_ATOL, err_msg=str(label))
        with RestClient(gateway_url(gateway)) as client:
            rest = client.complete(CASES[case].messages, **run)
        assert rest.usage is not None and rest.usage.completion_tokens == len(ref.tokens), label
        assert rest.text == answer.text, label
        _check_pcm16(rest.audio, ref.wav, label)


def test_rest_batched_answers_match_reference(build_gateway):
    """Every case at once through REST: rows that end at different frames each get their own."""
    name, model_dir, gateway, reference = build_gateway

    async def run_all():
        async with AsyncRestClient(gateway_url(gateway)) as client:
            jobs = [client.complete(c.messages, **c.options()) for c in CASES.values()]
            return await asyncio.gather(*jobs)

    for (case, c), rest in zip(CASES.items(), asyncio.run(run_all()), strict=True):
        ref = reference.run(chat_prompt_ids(model_dir, c.messages), c)
        assert rest.usage is not None and rest.usage.completion_tokens == len(ref.tokens), (name, case)
        _check_pcm16(rest.audio, ref.wav, (name, case))
