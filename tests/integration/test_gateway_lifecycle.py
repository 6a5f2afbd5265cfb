"""The gateway's request lifecycle against real stage processes: the concurrency bound, client
disconnects and cancel races that must leave nothing behind, the request timeout, and the stages'
measured speed read from their Info (the output itself: tests/integration/test_gateway.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading

import grpc
import httpx
import pytest

from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, stage_pb2

from .conftest import gateway_idle, gateway_process, metric, wait_for
from .test_gateway import EXTRA, MAX_CONCURRENCY, MESSAGES


@pytest.fixture(scope="module")
def gateway(stages):
    # An explicit cap and no queue: the request past the cap is refused at once, not queued.
    with gateway_process(stages, "--max-concurrency", str(MAX_CONCURRENCY), "--max-queue", "0") as gateway:
        yield gateway


def _url(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


def test_concurrency_bound_rejects_the_next_request(gateway):
    long = {
        "messages": MESSAGES,
        "max_tokens": 150,
        "ignore_eos": True,
        "stream": True,
        "modalities": ["text", "audio"],
        "max_audio_frames": 150,
        "talker_temperature": 0,
    }
    results: list[tuple[int, int]] = []
    started = threading.Barrier(MAX_CONCURRENCY + 1)

    def stream_one() -> None:
        with httpx.stream("POST", f"{_url(gateway)}/v1/chat/completions", json=long, timeout=300) as reply:
            started.wait(60)
            done = sum(1 for line in reply.iter_lines() if line == "data: [DONE]")
            results.append((reply.status_code, done))

    threads = [threading.Thread(target=stream_one) for _ in range(MAX_CONCURRENCY)]
    for t in threads:
        t.start()
    started.wait(60)  # all N are admitted and streaming
    extra = httpx.post(f"{_url(gateway)}/v1/chat/completions", json={**long, "stream": False}, timeout=30)

    async def grpc_extra():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            call = stub.Generate(gateway_pb2.GenerateRequest(messages=[common_pb2.Message(**MESSAGES[0])]))
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as exc:
                return exc.code(), dict(exc.trailing_metadata() or ())
            return grpc.StatusCode.OK, {}

    grpc_code, grpc_meta = asyncio.run(grpc_extra())
    for t in threads:
        t.join(300)
    assert extra.status_code == 429, extra.text
    assert int(extra.headers["Retry-After"]) >= 1
    assert extra.json()["error"]["type"] == "rate_limit_error"
    assert grpc_code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "retry-after" in grpc_meta
    assert results == [(200, 1)] * MAX_CONCURRENCY


def test_client_disconnect_mid_audio_frees_everything(gateway, stages):
    body = {
        "messages": MESSAGES,
        "max_tokens": 300,
        "ignore_eos": True,
        "stream": True,
        "modalities": ["text", "audio"],
        "max_audio_frames": 300,
        "talker_temperature": 0,
        "initial_codec_chunk_frames": 2,
    }
    with httpx.stream("POST", f"{_url(gateway)}/v1/chat/completions", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if (
                line.startswith("data: {")
                and '"audio"' in line
                and json.loads(line[6:])["choices"][0]["delta"].get("audio")
            ):
                break  # leave mid-audio: the connection closes here

    def idle() -> bool:
        stage_idle = all(
            metric(s, "omnistream_stage_running_requests") + metric(s, "omnistream_stage_waiting_requests")
            == 0
            for s in stages.values()
        )
        gw = httpx.get(f"{_url(gateway)}/metrics", timeout=5).text
        in_flight = [line for line in gw.splitlines() if line.startswith("omnistream_requests_in_flight ")]
        return stage_idle and float(in_flight[0].split()[1]) == 0

    assert asyncio.run(wait_for(idle, timeout=30.0))


def test_cancel_races_through_the_gateway_leave_nothing_behind(gateway, stages):
    _gateway_cancel_races(gateway, stages, rounds=8, seed=7)


@pytest.mark.slow
def test_hundreds_of_cancel_races_through_the_gateway_leave_nothing_behind(gateway, stages):
    _gateway_cancel_races(gateway, stages, rounds=250, seed=8)


def _gateway_cancel_races(gateway, stages, rounds: int, seed: int) -> None:
    """gRPC calls cancelled and REST streams dropped at random points of their life, one of each per
    round; then nothing is held anywhere and a normal request succeeds."""
    rng = random.Random(seed)
    body = {
        "messages": MESSAGES,
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": True,
        "max_audio_frames": 40,
        "initial_codec_chunk_frames": 2,
    }

    async def grpc_race(stub, i: int) -> None:
        call = stub.Generate(
            gateway_pb2.GenerateRequest(
                messages=[common_pb2.Message(role="user", content="Tell me about rivers.")],
                max_tokens=40,
                ignore_eos=True,
                max_audio_frames=40,
                request_id=f"grpc-race-{i}",
            ),
            timeout=60,
        )
        try:
            for _ in range(rng.randrange(0, 4)):
                await call.read()
            await asyncio.sleep(rng.uniform(0, 0.05))
        except grpc.aio.AioRpcError:
            pass  # e.g. RESOURCE_EXHAUSTED: a refusal is a fine outcome of a race
        finally:
            call.cancel()

    async def rest_race(client: httpx.AsyncClient) -> None:
        lines = rng.randrange(0, 6)
        with contextlib.suppress(httpx.HTTPError):
            async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
                async for _ in reply.aiter_lines():
                    lines -= 1
                    if lines < 0:
                        break  # leaving the block drops the connection

    async def run() -> bool:
        async with (
            grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel,
            httpx.AsyncClient(base_url=_url(gateway), timeout=60) as client,
        ):
            stub = gateway_pb2_grpc.GatewayStub(channel)
            for i in range(rounds):
                await asyncio.gather(grpc_race(stub, i), rest_race(client))
        return await wait_for(lambda: gateway_idle(gateway, stages), timeout=30.0, interval=0.2)

    assert asyncio.run(run())
    reply = httpx.post(f"{_url(gateway)}/v1/chat/completions", json={**body, "stream": False}, timeout=120)
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] == 40


def _stage_gauge(gateway, name: str) -> dict[str, float]:
    """stage -> value of a gateway gauge labelled by stage (as /metrics shows it now)."""
    values = {}
    for line in httpx.get(f"{_url(gateway)}/metrics").text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            values[labels.split('stage="', 1)[1].split('"', 1)[0]] = float(value)
    return values


def test_the_gateway_learns_the_stages_measured_speed_from_their_info(stages):
    async def talker_info():
        from omnistream.proto.omni.v1 import stage_pb2_grpc

        async with grpc.aio.insecure_channel(stages["talker"].address) as channel:
            return await stage_pb2_grpc.TalkerServiceStub(channel).Info(stage_pb2.InfoRequest(), timeout=10)

    def measured() -> bool:
        capacity = _stage_gauge(gateway, "omnistream_stage_capacity_per_second")
        return all(capacity.get(stage, 0) > 0 for stage in ("thinker", "talker", "code2wav"))

    # The hold on, as a real deployment has it; one request at a time is never held.
    with gateway_process(stages, "--audio-hold") as gateway:
        body = {"messages": MESSAGES, "modalities": ["text", "audio"], "max_tokens": 24, **EXTRA}
        reply = httpx.post(f"{_url(gateway)}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text[:500]
        load = asyncio.run(talker_info()).load
        assert load.measured_steps > 0 and load.capacity_per_second > 0 and load.mean_batch >= 1
        # The warm-up probe ran batches up to max_batch: the step-time model stands on several
        # sizes whatever this request's batch was (how much a batch gains is a unit test's:
        # tests/unit/service/test_step_model.py; a probe under CPU load may measure none).
        assert load.model_points >= 2 and load.step_unit_seconds > 0 and load.units_per_row == 1
        # The gateway reads the loads in its health rounds (every second); no timing is asserted,
        # only that the measure arrives: every stage ran steps for the request.
        assert asyncio.run(wait_for(measured, timeout=60, interval=0.2))
        metrics = httpx.get(f"{_url(gateway)}/metrics").text
        for name in (
            "omnistream_stage_output_per_second",
            "omnistream_audio_streams",
            "omnistream_audio_headroom_ratio",
            "omnistream_requests_audio_waiting",
            "omnistream_requests_audio_held_total",
            "omnistream_audio_assumed_capacity_per_second",
        ):
            assert name in metrics


def test_timeout_ends_with_504_and_frees_the_stages(gateway, stages):
    body = {
        "messages": MESSAGES,
        "max_tokens": 3000,
        "ignore_eos": True,
        "modalities": ["text", "audio"],
        "max_audio_frames": 2000,
        "talker_temperature": 0,
        "timeout": 1.0,
    }
    reply = httpx.post(f"{_url(gateway)}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 504, reply.text
    assert reply.json()["error"]["code"] == "deadline_exceeded"

    def idle() -> bool:
        return all(
            metric(s, "omnistream_stage_running_requests") + metric(s, "omnistream_stage_waiting_requests")
            == 0
            for s in stages.values()
        )

    assert asyncio.run(wait_for(idle, timeout=2.0))
