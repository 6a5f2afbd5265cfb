"""The gateway core's admission limits come from its replicas' Info (gateway/admission/limits.py):
the default gateway admits what the stages hold, not a fixed 16, follows replicas leaving and
coming back, shows the limits on /metrics, and an operator's cap still wins (fake stage stubs; no
stage runs)."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import generate_latest

from gateway.admission.limits import Limits
from gateway.admission.permits import Permit, Rejected
from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from tests.unit.gateway.serving.test_core_audio import FakeHealth, FakeStub, close

THINKERS = ["127.0.0.1:1", "127.0.0.1:4"]


class Stub(FakeStub):
    """A stage whose Info says it holds `max_requests` requests at once."""

    def __init__(self, stage: str, max_requests: int) -> None:
        super().__init__(stage)
        self.max_requests = max_requests

    async def Info(self, request, timeout=None):
        info = await super().Info(request, timeout)
        info.limits.max_requests = self.max_requests
        return info


async def core_over(max_requests: int = 32, **config) -> GatewayCore:
    """A core over two thinkers, a talker and a code2wav, each holding `max_requests`."""
    core = GatewayCore(
        GatewayConfig(thinker=THINKERS, talker=["127.0.0.1:2"], code2wav=["127.0.0.1:3"], **config)
    )
    for stage, replica_set in core.replicas.sets.items():
        for replica in replica_set.replicas:
            replica.health, replica.stub = FakeHealth(), Stub(stage, max_requests)
    await core.replicas.check_all()
    assert core.ready
    return core


async def admitted(core: GatewayCore, count: int, audio: bool = False) -> list[Permit]:
    return [await asyncio.wait_for(core.admission.acquire(audio=audio), 0.5) for _ in range(count)]


def limit_gauges(core: GatewayCore) -> dict[str, float]:
    text = generate_latest(core.metrics.registry).decode()
    prefix = 'omnistream_admission_limit{kind="'
    return {
        line[len(prefix) :].split('"')[0]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


async def test_the_default_gateway_admits_what_the_stages_hold_not_a_fixed_16():
    core = await core_over(max_requests=32)
    assert core.admission.limits() == Limits(concurrency=64, queue=64, audio_hold=64, audio=32)
    permits = await admitted(core, 17, audio=True)  # the 17th, with audio: admitted at once
    permits += await admitted(core, 64 - 17)  # and text up to the thinkers' 64
    assert core.admission.active == 64
    assert limit_gauges(core) == {"concurrency": 64, "audio": 32, "queue": 64, "audio_hold": 64}
    for permit in permits:
        permit.release()
    await close(core)


async def test_the_limits_follow_replicas_leaving_and_coming_back():
    core = await core_over(max_requests=32)
    _, second = core.replicas.sets["thinker"].replicas
    core.replicas.mark_failed(second)
    assert core.admission.limits().concurrency == 32 and limit_gauges(core)["concurrency"] == 32
    permits = await admitted(core, 32)
    waiting = asyncio.create_task(core.admission.acquire())
    await asyncio.sleep(0.01)
    assert not waiting.done() and core.admission.waiting == 1  # queued, not refused
    await core.replicas.check_all()  # the health round that finds it serving again
    permits.append(await asyncio.wait_for(waiting, 1))
    assert core.admission.limits().concurrency == 64
    for permit in permits:
        permit.release()
    await close(core)


async def test_an_operators_cap_wins_over_what_the_stages_hold():
    core = await core_over(max_requests=32, max_concurrency=16, max_queue=0)
    assert core.admission.limits() == Limits(concurrency=16, queue=0, audio_hold=16)
    permits = await admitted(core, 16)
    with pytest.raises(Rejected) as refused:
        await admitted(core, 1)
    assert refused.value.reason == "concurrency"
    for permit in permits:
        permit.release()
    await close(core)
