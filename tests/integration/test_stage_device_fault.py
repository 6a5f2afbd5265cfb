"""A stage whose device is poisoned (a CUDA fault) stops for a restart: its running request gets an
explicit UNAVAILABLE, health turns NOT_SERVING, and the process exits non-zero (a real process; the
fault is injected by tests/integration/device_fault_hook)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from omnistream.cli.launcher import start_services
from omnistream.proto.omni.v1 import stage_pb2, stage_pb2_grpc
from omnistream.service.bootstrap import EXIT_DEVICE_POISONED
from omnistream.wire.chunk_key import ChunkKey, Stage
from tests.integration.conftest import stage_args

HOOK = Path(__file__).parent / "device_fault_hook"


def _open(rid: str) -> stage_pb2.ThinkerRequest:
    return stage_pb2.ThinkerRequest(
        key=ChunkKey(rid, Stage.GATEWAY, 0).to_proto(),
        open=stage_pb2.ThinkerOpen(
            request_id=rid, prompt_text="Tell me about rivers.", max_tokens=2000, ignore_eos=True
        ),
    )


def test_a_poisoned_device_fails_the_request_turns_not_serving_and_exits(tiny_model_dir, tmp_path):
    trigger = tmp_path / "fault"
    path = os.pathsep.join(filter(None, [str(HOOK), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path, "OMNISTREAM_TEST_DEVICE_FAULT": str(trigger)}
    services = start_services(
        {"thinker": stage_args("thinker", tiny_model_dir, "--max-model-len", "4096")}, env=env
    )
    thinker = services["thinker"]
    try:

        async def run() -> tuple[grpc.StatusCode, str, list[int]]:
            async with grpc.aio.insecure_channel(thinker.address) as channel:
                watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
                statuses = [(await watch.read()).status]
                call = stage_pb2_grpc.ThinkerServiceStub(channel).Stream(timeout=60)
                await call.write(_open("r1"))
                await call.done_writing()
                await call.read()  # it is running
                trigger.write_text("now")
                try:
                    while await call.read() != grpc.aio.EOF:
                        pass
                    code, details = grpc.StatusCode.OK, ""
                except grpc.aio.AioRpcError as exc:
                    code, details = exc.code(), exc.details() or ""

                async def until_not_serving() -> None:
                    while (reply := await watch.read()) != grpc.aio.EOF:
                        statuses.append(reply.status)
                        if reply.status == health_pb2.HealthCheckResponse.NOT_SERVING:
                            return

                # A stage that did not see the fault would keep saying SERVING: bounded, asserted below.
                with contextlib.suppress(grpc.aio.AioRpcError, TimeoutError):
                    await asyncio.wait_for(until_not_serving(), 30)
                watch.cancel()
                return code, details, statuses

        code, details, statuses = asyncio.run(run())
        assert code == grpc.StatusCode.UNAVAILABLE and "lost its device" in details
        assert statuses == [
            health_pb2.HealthCheckResponse.SERVING,
            health_pb2.HealthCheckResponse.NOT_SERVING,
        ]
        assert thinker.proc.wait(timeout=60) == EXIT_DEVICE_POISONED
    finally:
        thinker.stop()
