"""Stages describe themselves (Info), and the gateway learns the deployment from them: real processes.

The expected values are read from the tiny checkpoint's config.json here, independently of
`omnistream.models.qwen3_omni.describe`, so a wrong reading there fails these tests.
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import grpc
import httpx
import pytest

from omnistream.cli.launcher import start_services
from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, stage_pb2, stage_pb2_grpc

from .conftest import gateway_args, gateway_url, stage_args

STUBS = {
    "thinker": stage_pb2_grpc.ThinkerServiceStub,
    "talker": stage_pb2_grpc.TalkerServiceStub,
    "code2wav": stage_pb2_grpc.Code2WavServiceStub,
}


async def _info(stub_cls, address: str, request=None):
    async with grpc.aio.insecure_channel(address) as channel:
        return await stub_cls(channel).Info(request or stage_pb2.InfoRequest(), timeout=10)


@pytest.fixture(scope="module")
def checkpoint(tiny_model_dir) -> dict:
    return json.loads((Path(tiny_model_dir) / "config.json").read_text())


def test_every_stage_reports_its_checkpoint_and_limits(stages, checkpoint):
    infos = {s: asyncio.run(_info(STUBS[s], stages[s].address)) for s in STUBS}
    talker_config, decoder = checkpoint["talker_config"], checkpoint["code2wav_config"]
    fps = 24000 / math.prod(decoder["upsample_rates"] + decoder["upsampling_ratios"])
    assert fps == 12.5  # the tiny checkpoint has the real model's decoder rates
    for stage, info in infos.items():
        assert info.stage == common_pb2.Stage.Value(f"STAGE_{stage.upper()}")
        assert (info.model_id, info.family, info.chunk_protocol_version) == ("qwen3-omni", "qwen3_omni", 1)
        assert info.software_version
        assert info.limits.max_batch == 8 and info.limits.max_requests == 32  # --max-batch 8: 4x
        assert info.limits.max_message_bytes == 16 * 1024 * 1024
    thinker, talker, code2wav = infos["thinker"], infos["talker"], infos["code2wav"]
    assert list(thinker.input_modalities) == ["text", "audio", "image", "video"]
    assert thinker.limits.max_model_len == 4096
    assert not (thinker.voices or thinker.sample_rate or thinker.codebooks)
    assert list(talker.voices) == sorted(k.lower() for k in talker_config["speaker_id"])
    assert talker.default_voice == "ethan" and not (thinker.default_voice or code2wav.default_voice)
    assert (talker.codebooks, talker.frames_per_second) == (talker_config["num_code_groups"], fps)
    assert talker.limits.max_model_len == 8192 and talker.limits.max_frames == 8192
    assert not (talker.sample_rate or talker.input_modalities)
    assert (code2wav.sample_rate, code2wav.codebooks) == (24000, decoder["num_quantizers"])
    assert code2wav.frames_per_second == fps and not code2wav.voices


def test_malformed_info_request_is_invalid_argument(stages):
    async def call() -> grpc.StatusCode:
        async with grpc.aio.insecure_channel(stages["talker"].address) as channel:
            raw = channel.unary_unary("/omni.v1.TalkerService/Info")
            try:
                await raw(b"\xff\xff", timeout=10)
            except grpc.aio.AioRpcError as exc:
                return exc.code()
            return grpc.StatusCode.OK

    assert asyncio.run(call()) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture(scope="module")
def mixed(stages, tiny_model_dir):
    """The shared stages plus a talker serving another model name, behind one gateway."""
    other = start_services(
        {"talker-other": stage_args("talker", tiny_model_dir, "--served-model-name", "not-qwen")}
    )
    try:
        gateway = start_services({"gateway": gateway_args({**stages, **other})})["gateway"]
        try:
            yield gateway, other["talker-other"]
        finally:
            gateway.stop()
    finally:
        other["talker-other"].stop()


def test_a_disagreeing_replica_is_refused_while_the_agreeing_ones_serve(mixed, stages, checkpoint):
    gateway, other = mixed
    base = gateway_url(gateway)
    ready = httpx.get(f"{base}/ready", timeout=10).json()
    talkers = {r["address"]: r for r in ready["stages"]["talker"]}
    good, bad = talkers[stages["talker"].address], talkers[other.address]
    assert good["in_rotation"] and good["refused"] is None
    assert bad["healthy"] and not bad["in_rotation"]
    assert "model_id 'not-qwen' (deployment: 'qwen3-omni')" in bad["refused"]

    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "modalities": ["text", "audio"],
        "max_tokens": 4,
        "max_audio_frames": 6,
        "talker_temperature": 0,
        "stream": False,
    }
    for _ in range(3):  # least-loaded choice would use the idle refused talker if it could
        reply = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert (
            reply.json()["model"] == "qwen3-omni" and reply.json()["choices"][0]["message"]["audio"]["data"]
        )
    talkers = {r["address"]: r for r in httpx.get(f"{base}/ready", timeout=10).json()["stages"]["talker"]}
    assert talkers[other.address]["served"] == 0 and talkers[stages["talker"].address]["served"] >= 3

    (model,) = httpx.get(f"{base}/v1/models", timeout=10).json()["data"]
    voices = sorted(k.lower() for k in checkpoint["talker_config"]["speaker_id"])
    assert (model["id"], model["object"], model["owned_by"]) == ("qwen3-omni", "model", "omnistream")
    assert model["omnistream"]["voices"] == voices and model["omnistream"]["sample_rate"] == 24000
    assert model["omnistream"]["input_modalities"] == ["text", "audio", "image", "video"]

    async def gateway_info() -> gateway_pb2.GatewayInfo:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            return await gateway_pb2_grpc.GatewayStub(channel).Info(
                gateway_pb2.GatewayInfoRequest(), timeout=10
            )

    info = asyncio.run(gateway_info())
    assert (info.model_id, info.family, list(info.voices)) == ("qwen3-omni", "qwen3_omni", voices)
    assert (info.sample_rate, info.frames_per_second) == (24000, 12.5)
    assert [s.stage for s in info.stages] == [1, 2, 3]
    assert all(s.model_id == "qwen3-omni" for s in info.stages)
