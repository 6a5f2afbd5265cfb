"""GatewayCore's chunk plan: built per request at the open from the request's knobs and the load."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.admission.limits import Limits
from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest


def _plan(active: int = 0, **fields):
    # Speed unknown (no stage reported a load): the plan falls back to the load rule.
    unknown = SimpleNamespace(headroom=lambda streams: None)
    core = SimpleNamespace(
        admission=SimpleNamespace(
            active=active, audio_active=active, audio_held=0, limits=lambda: Limits.of(None, 8)
        ),
        audio_capacity=lambda: unknown,
        config=GatewayConfig(max_concurrency=8),
        audio_arriving=0,
    )
    core.sizing_streams = lambda permit=None: GatewayCore.sizing_streams(core, permit)  # type: ignore[arg-type]
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}], **fields)
    return GatewayCore.chunk_plan(core, request)  # type: ignore[arg-type]


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
