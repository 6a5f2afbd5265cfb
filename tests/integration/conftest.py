"""Real stage services as child processes on loopback ports, always stopped afterwards."""

from __future__ import annotations

import asyncio
import re
import urllib.request

import pytest

from omnistream.launcher import ServiceProcess, start_services
from omnistream.protogen import ensure_generated

ensure_generated()

STAGES = ("thinker", "talker", "code2wav")


def stage_args(stage: str, model_dir: str, *extra: str) -> list[str]:
    return ["serve", stage, "--model", model_dir, "--dtype", "float64", "--max-batch", "8", *extra]


@pytest.fixture(scope="session")
def stages(tiny_model_dir):
    services = start_services({s: stage_args(s, tiny_model_dir) for s in STAGES})
    try:
        yield services
    finally:
        for service in services.values():
            service.stop()


def metric(service: ServiceProcess, name: str) -> float:
    """Sum of a metric's samples on the service's /metrics endpoint."""
    body = (
        urllib.request.urlopen(f"http://{service.connect_host}:{service.metrics_port}/metrics", timeout=5)
        .read()
        .decode()
    )
    samples = [
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if re.match(rf"^{name}(\{{|\s)", line)
    ]
    if not samples:
        raise AssertionError(f"{service.name} exposes no metric {name}")
    return sum(samples)


async def wait_for(predicate, timeout: float = 5.0, interval: float = 0.05) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return predicate()
