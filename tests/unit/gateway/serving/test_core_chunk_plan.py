"""The gateway's chunk plan (AudioPlanner, asked by GatewayCore.open): built per request at the
open from the request's knobs and the load."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.admission.audio_planner import AudioPlanner
from gateway.admission.limits import Limits
from gateway.cluster.deployment import Deployment
from gateway.config import GatewayConfig
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest


def _plan(active: int = 0, **fields):
    # Speed unknown (no audio stage replica reported a load): the plan falls back to the load rule.
    no_replicas = SimpleNamespace(sets={s: SimpleNamespace(replicas=[]) for s in ("talker", "code2wav")})
    admission = SimpleNamespace(
        active=active, audio_active=active, audio_held=0, limits=lambda: Limits.of(None, 8)
    )
    config = GatewayConfig(max_concurrency=8)
    planner = AudioPlanner(no_replicas, Deployment(), admission, config)  # type: ignore[arg-type]
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], **fields)
    return planner.chunk_plan(request)


def test_the_plan_takes_the_requests_schedule():
    assert _plan().schedule == "grow"
    assert _plan(codec_chunk_schedule="fixed").schedule == "fixed"
    plan = _plan(initial_codec_chunk_frames=3, codec_chunk_frames=20, codec_chunk_schedule="grow")
    assert (plan.initial, plan.chunk, plan.window_lengths(5)) == (3, 20, [3, 3, 6, 12, 20])


def test_under_load_the_first_window_is_larger_and_the_rest_still_grow():
    plan = _plan(active=8)
    assert plan.initial == 16 and plan.window_lengths(4) == [16, 16, 25, 25]


def test_an_unknown_schedule_is_invalid_naming_the_field():
    with pytest.raises(InvalidRequest) as info:
        _plan(codec_chunk_schedule="doubling")
    assert info.value.field == "codec_chunk_schedule"
