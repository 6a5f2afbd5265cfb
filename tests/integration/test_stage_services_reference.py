"""The three stage services driven directly over gRPC, against the transformers reference
(tests/reference_runs.py), on the tiny builds: tokens, codes and audio, however an answer ends."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from omnistream.cli.launcher import start_services
from tests.reference_runs import CASES, runs_for

from .conftest import stage_args
from .stage_calls import collect_services

AUDIO_ATOL = float(np.spacing(np.float32(1)))  # float64 engines ship float32 samples


# `make test` runs the ending build (its answers are short); the never-ending one is also held to
# the pipeline (test_stage_services.py::test_services_match_in_process_pipeline) and that to the
# reference, so it and the second seed and size run here in `make test-slow`.
@pytest.fixture(
    scope="module",
    params=[
        "ending",
        pytest.param("never-ending", marks=pytest.mark.slow),
        pytest.param("seed7-h96", marks=pytest.mark.slow),
    ],
)
def build_stages(request, references, build_dirs):
    """(name, stages, reference): the session's stages for the two tiny builds, stages of its own
    (stopped afterwards) for the second seed and size."""
    name = request.param
    shared = {"never-ending": "stages", "ending": "ending_stages"}
    if name in shared:
        yield name, request.getfixturevalue(shared[name]), references(name)
        return
    services = start_services({s: stage_args(s, build_dirs(name)) for s in ("thinker", "talker", "code2wav")})
    try:
        yield name, services, references(name)
    finally:
        for service in services.values():
            service.stop()


def _assert_reference(result, reference, case, label) -> None:
    _, codes, audio, done = result
    ref = reference.run(list(done.prompt_ids), CASES[case])
    assert done.output_ids == ref.tokens, label
    np.testing.assert_array_equal(codes, ref.codes, err_msg=str(label))
    assert audio.shape == ref.wav.shape, label
    np.testing.assert_allclose(audio, ref.wav, rtol=0, atol=AUDIO_ATOL, err_msg=str(label))


@pytest.mark.parametrize("case", list(CASES))
def test_services_match_reference(build_stages, case):
    """Each case alone, async and sequential, both chunk schedules (two per case, all four across
    the cases; the pipeline's test runs all four of each): the reference's tokens, codes and
    audio, whichever way the answer ends."""
    name, services, reference = build_stages
    for mode, schedule in runs_for(name, case, outer=True):
        rid = f"ref-{name}-{case}-{mode}-{schedule}"
        result = asyncio.run(collect_services(services, CASES[case].request(mode, schedule), rid))
        _assert_reference(result, reference, case, (name, case, mode, schedule))


@pytest.mark.parametrize("mode", ["async", "sequential"])
def test_services_batched_match_reference(build_stages, mode):
    """Every case at once (rows ending at different frames, by different ends): each its reference."""
    name, services, reference = build_stages

    async def run_all():
        return await asyncio.gather(
            *(
                collect_services(services, c.request(mode), f"ref-batch-{name}-{k}-{mode}")
                for k, c in CASES.items()
            )
        )

    for case, result in zip(CASES, asyncio.run(run_all()), strict=True):
        _assert_reference(result, reference, case, (name, case, mode, "batched"))
