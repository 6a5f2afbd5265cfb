"""Real stage services as child processes on loopback ports, always stopped afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.request
from collections.abc import Iterator

import grpc
import pytest
import yaml

from omnistream.cli.launcher import ServiceProcess, start_services
from omnistream.engine.settings import EngineSettings
from omnistream.wire.protogen import ensure_generated

ensure_generated()

STAGES = ("thinker", "talker", "code2wav")


def stage_args(stage: str, model_dir: str, *extra: str) -> list[str]:
    return ["serve", stage, "--model", model_dir, "--dtype", "float64", "--max-batch", "8", *extra]


def gateway_args(stages: dict, *extra: str) -> list[str]:
    """A gateway over `stages`, with the audio hold off unless `extra` says `--audio-hold`: on a
    shared CPU the tiny model's talker is about twice real time at batch 1, so the hold rightly
    holds a second audio stream, and every test of concurrency would become a test of timing."""
    args = ["serve", "gateway", "--http-port", "0", "--grpc-port", "0", "--no-audio-hold"]
    for name, service in stages.items():
        args += [f"--{name.split('-')[0]}", service.address]
    return [*args, *extra]


def gateway_url(gateway: ServiceProcess) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


@contextlib.contextmanager
def replicated_stack(tiny_model_dir: str) -> Iterator[dict[str, ServiceProcess]]:
    """A thinker, two talker replicas, a code2wav and a gateway of their own (for tests that kill)."""
    specs = {
        "thinker": stage_args("thinker", tiny_model_dir),
        "talker-a": stage_args("talker", tiny_model_dir),
        "talker-b": stage_args("talker", tiny_model_dir),
        "code2wav": stage_args("code2wav", tiny_model_dir),
    }
    services = start_services(specs)
    try:
        services.update(start_services({"gateway": gateway_args(services)}))
        yield services
    finally:
        for service in services.values():
            service.stop()


@contextlib.contextmanager
def stack_beside(
    shared: dict[str, ServiceProcess], specs: dict[str, list[str]]
) -> Iterator[dict[str, ServiceProcess]]:
    """`shared` services (the session's, left running) plus services of its own started from
    `specs`, and a gateway over all of them; only what it started is stopped. For a test that
    kills some replicas and not others: what it never kills need not be started again."""
    own = start_services(specs)
    try:
        services = {**shared, **own}
        own.update(start_services({"gateway": gateway_args(services)}))
        yield {**services, "gateway": own["gateway"]}
    finally:
        for service in own.values():
            service.stop()


# The gateway's `seed` setting, for tests whose clients sample with their defaults and cannot send a
# seed (agent frameworks): a turn's sampled answer is then the same every run (the setting derives a
# request's seed from its content), not now and then an edge case of a random checkpoint (an answer
# that ends at its first token).
REPEATABLE_ANSWERS = {"seed": 20261206}


@contextlib.contextmanager
def gateway_process(stages: dict, *extra: str) -> Iterator[ServiceProcess]:
    """A gateway of its own over `stages` (with `extra` flags), stopped however the test ends."""
    services = start_services({"gateway": gateway_args(stages, *extra)})
    try:
        yield services["gateway"]
    finally:
        services["gateway"].stop()


@contextlib.contextmanager
def configured_gateway(stages: dict, directory, config: dict) -> Iterator[ServiceProcess]:
    """A gateway of its own over `stages`, configured by a YAML file written into `directory`."""
    path = directory / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    with gateway_process(stages, "--config", str(path)) as gateway:
        yield gateway


@contextlib.contextmanager
def stages_on(model_dir: str) -> Iterator[dict[str, ServiceProcess]]:
    """The three stages on `model_dir`, stopped however the caller ends."""
    services = start_services({s: stage_args(s, model_dir) for s in STAGES})
    try:
        yield services
    finally:
        for service in services.values():
            service.stop()


@pytest.fixture(scope="session")
def stages(tiny_model_dir):
    with stages_on(tiny_model_dir) as services:
        yield services


@pytest.fixture(scope="session")
def local_pipeline(tiny_model_dir):
    """The in-process pipeline on the `stages` fixture's checkpoint and settings (float64, max batch
    8): what the services are compared against, loaded once for every module that compares."""
    from omnistream.pipeline import Pipeline

    with Pipeline(tiny_model_dir, EngineSettings(dtype="float64", max_batch=8)) as pipeline:
        yield pipeline


@pytest.fixture(scope="session")
def ending_stages(ending_tiny_model_dir):
    """The three stages on the tiny checkpoint `make run` serves, whose answers end by themselves
    (the `stages` fixture's run to their limits, for fixed lengths)."""
    with stages_on(ending_tiny_model_dir) as services:
        yield services


def metric(service: ServiceProcess, name: str, timeout: float = 5.0) -> float:
    """Sum of a metric's samples on the service's /metrics endpoint."""
    return metric_at(f"http://{service.connect_host}:{service.metrics_port}/metrics", name, timeout)


async def wait_for(predicate, timeout: float = 5.0, interval: float = 0.05) -> bool:
    """Poll `predicate` until it holds or `timeout` passes. A poll that cannot reach a service (a
    scrape that timed out on a loaded machine: CI once waited 5 s for a stage's /metrics) is "not
    yet"; only the last poll's error is raised."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        try:
            if predicate():
                return True
        except OSError:  # urllib's URLError and a socket timeout among them
            pass
        await asyncio.sleep(interval)
    return predicate()


def gateway_idle(gateway: ServiceProcess, stages: dict[str, ServiceProcess]) -> bool:
    """No request anywhere: every stage's engine and streams empty, nothing in flight at the gateway."""
    for s in stages.values():
        for name in ("engine_requests", "orphaned_requests", "open_streams"):
            if metric(s, f"omnistream_stage_{name}") != 0:
                return False
    return metric_at(f"{gateway_url(gateway)}/metrics", "omnistream_requests_in_flight") == 0


def metric_at(url: str, name: str, timeout: float = 5.0) -> float:
    """`timeout`: for one scrape; a poll (`wait_for`) keeps the short default and scrapes again, a
    single read outside one gives a loaded machine's busy stage more."""
    body = urllib.request.urlopen(url, timeout=timeout).read().decode()
    samples = [
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if re.match(rf"^{name}(\{{|\s)", line)
    ]
    if not samples:
        raise AssertionError(f"{url} exposes no metric {name}")
    return sum(samples)


def thinker_requests(stages: dict[str, ServiceProcess]) -> float:
    """Requests the thinker has admitted so far: unchanged means a refusal never reached it."""
    return metric(stages["thinker"], "omnistream_stage_requests_total")


def grpc_refusal(gateway: ServiceProcess, request) -> grpc.aio.AioRpcError:
    """The status `omni.v1.Gateway/Generate` refuses `request` with (it must refuse it)."""
    from omnistream.proto.omni.v1 import gateway_pb2_grpc

    async def call() -> grpc.aio.AioRpcError:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            try:
                async for _ in stub.Generate(request):
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc
            raise AssertionError("the gateway answered a request it should have refused")

    return asyncio.run(call())


def shared_thinker_steps(stages) -> float:
    """Decode steps the thinker has run with more than one request in them, so far."""
    url = f"http://{stages['thinker'].connect_host}:{stages['thinker'].metrics_port}/metrics"
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    alone = re.search(r'^omnistream_stage_batch_size_bucket\{[^}]*le="1\.0"[^}]*\} (\S+)$', body, re.M)
    assert alone is not None, "the thinker exposes no batch size histogram"
    return metric(stages["thinker"], "omnistream_stage_batch_size_count") - float(alone.group(1))
