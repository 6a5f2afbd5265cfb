"""The gateway in front of the real stage services, as clients use it (openai SDK, gRPC, HTTP)."""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys

import grpc
import httpx
import numpy as np
import pytest
import torch
from openai import OpenAI

from omnistream.audio.wav import read_float32_wav, to_pcm16
from omnistream.pipeline import GenerationRequest, collect
from omnistream.proto.omni.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc, stage_pb2
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.defaults import RequestInput, resolve
from omnistream.wire.tensors import numpy_from_proto

from .conftest import gateway_process, metric
from .stage_calls import collect_services

MESSAGES = [{"role": "user", "content": "Tell me a story about the sea."}]
EXTRA = {
    "talker_temperature": 0,
    "talker_repetition_penalty": 1.0,
    "initial_codec_chunk_frames": 4,
    "max_audio_frames": 40,
}
MAX_CONCURRENCY = 3


@pytest.fixture(scope="module")
def gateway(stages):
    with gateway_process(stages, "--max-concurrency", str(MAX_CONCURRENCY)) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def expected(local_pipeline):
    request = GenerationRequest(
        messages=MESSAGES, max_tokens=24, max_audio_frames=40, initial_codec_chunk_frames=4
    )
    return asyncio.run(collect(local_pipeline, request))


@pytest.fixture(scope="module")
def expected_full(local_pipeline, expected) -> np.ndarray:
    """The one-shot Code2Wav decode of the expected codes (float64, shipped as float32)."""
    code2wav = local_pipeline.code2wav.code2wav
    with torch.no_grad():
        return code2wav(torch.from_numpy(expected.codes)[None]).reshape(-1).float().numpy()


def _url(gateway) -> str:
    return f"http://127.0.0.1:{gateway.http_port}"


def test_openai_sdk_streams_text_and_audio(gateway, expected):
    client = OpenAI(base_url=f"{_url(gateway)}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="qwen3-omni",
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "pcm16"},
        stream=True,
        max_tokens=24,
        temperature=0,
        extra_body=EXTRA,
    )
    text, pcm, finish, usage, audio_chunks = [], [], None, None, 0
    deltas = []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        deltas.append(delta)
        assert delta.content is None  # OpenAI's audio answers: the text is the transcript only
        if delta.audio and delta.audio.transcript:
            text.append(delta.audio.transcript)
        if delta.audio and delta.audio.data:
            pcm.append(base64.b64decode(delta.audio.data))
            audio_chunks += 1
        finish = chunk.choices[0].finish_reason or finish
    assert "".join(text) == expected.text
    assert audio_chunks >= 2 and finish in ("stop", "length")
    # OpenAI's shape: the role first; the id on the first audio delta only; the last audio delta
    # holds only expires_at; then the finish.
    assert deltas[0].role == "assistant" and deltas[0].audio is None
    audio = [d.audio for d in deltas if d.audio is not None]
    assert audio[0].id and all(a.id is None for a in audio[1:])
    assert [a.expires_at is not None for a in audio] == [False] * (len(audio) - 1) + [True]
    assert audio[-1].data is None and audio[-1].transcript is None
    assert deltas[-1].audio is None and deltas[-1].content is None
    assert usage.completion_tokens == len(expected.output_ids)
    decoded = np.frombuffer(b"".join(pcm), dtype="<i2").astype(np.float32) / 32767.0
    assert decoded.shape == expected.audio.shape
    np.testing.assert_allclose(decoded, expected.audio, atol=1.0 / 32767 + 1e-6)


@pytest.mark.parametrize(
    "schedule",
    [stage_pb2.CHUNK_SCHEDULE_UNSPECIFIED, stage_pb2.CHUNK_SCHEDULE_FIXED],
    ids=["default", "fixed"],
)
def test_grpc_api_audio_is_bit_exact_float32(gateway, expected, expected_full, schedule):
    async def run():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            request = gateway_pb2.GenerateRequest(
                messages=[common_pb2.Message(**m) for m in MESSAGES],
                max_tokens=24,
                max_audio_frames=40,
                sampling=common_pb2.Sampling(temperature=0),
                talker_sampling=common_pb2.Sampling(temperature=0),
                initial_codec_chunk_frames=4,
                codec_chunk_schedule=schedule,
            )
            text, audio, kinds = [], [], []
            async for event in stub.Generate(request):
                kind = event.WhichOneof("event")
                kinds.append(kind)
                if kind == "text":
                    text.append(event.text.text)
                elif kind == "audio":
                    audio.append(numpy_from_proto(event.audio.pcm, copy=True))
            return "".join(text), audio, kinds

    text, chunks, kinds = asyncio.run(run())
    audio = np.concatenate(chunks)
    assert text == expected.text
    assert kinds[-1] == "end"
    if schedule == stage_pb2.CHUNK_SCHEDULE_UNSPECIFIED:  # the pipeline's (default) plan
        np.testing.assert_array_equal(audio, expected.audio)
    # The audio chunks are the windows of the plan asked for: growing by default, else fixed.
    plan = ChunkPlan(4, 25, 25, "fixed" if schedule == stage_pb2.CHUNK_SCHEDULE_FIXED else "grow")
    windows = plan.windows(expected.codes.shape[1])
    assert [c.size for c in chunks] == [windows[0] * 1920 - 555] + [n * 1920 for n in windows[1:]]
    # Exact streaming: that audio is the one-shot decode of the codes (one float32 step of rounding).
    assert audio.shape == expected_full.shape
    np.testing.assert_allclose(audio, expected_full, rtol=0, atol=float(np.spacing(np.float32(1))))


def test_non_streaming_returns_whole_text_and_wav(gateway, expected):
    body = {
        "messages": MESSAGES,
        "modalities": ["text", "audio"],
        "temperature": 0,
        "max_tokens": 24,
        "audio": {"voice": "ethan", "format": "wav"},
        **EXTRA,
    }
    reply = httpx.post(f"{_url(gateway)}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    assert message["content"] is None and message["audio"]["transcript"] == expected.text
    assert message["audio"]["id"] and message["audio"]["expires_at"] > 0
    wav = base64.b64decode(message["audio"]["data"])
    assert wav[:4] == b"RIFF" and len(wav) == 44 + 2 * expected.audio.size
    # the extension that keeps the text in `content` too
    reply = httpx.post(
        f"{_url(gateway)}/v1/chat/completions", json={**body, "transcript_in_content": True}, timeout=120
    )
    message = reply.json()["choices"][0]["message"]
    assert message["content"] == message["audio"]["transcript"] == expected.text


def test_transcript_in_content_streams_the_text_in_both_fields(gateway, expected):
    client = OpenAI(base_url=f"{_url(gateway)}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="qwen3-omni",
        messages=MESSAGES,
        modalities=["text", "audio"],
        audio={"voice": "ethan", "format": "pcm16"},
        stream=True,
        max_tokens=24,
        temperature=0,
        extra_body={**EXTRA, "transcript_in_content": True},
    )
    content, transcript = [], []
    for chunk in stream:
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta and delta.audio and delta.audio.transcript:
            transcript.append(delta.audio.transcript)
            assert delta.content == delta.audio.transcript
        elif delta and delta.content:
            content.append(delta.content)
    assert "".join(transcript) == expected.text and not content


def test_text_only_answers_stream_content_as_before(gateway, expected):
    client = OpenAI(base_url=f"{_url(gateway)}/v1", api_key="unused")
    stream = client.chat.completions.create(
        model="qwen3-omni", messages=MESSAGES, modalities=["text"], stream=True, max_tokens=24, temperature=0
    )
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert all(d.audio is None for d in deltas)
    assert "".join(d.content or "" for d in deltas) == expected.text


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": MESSAGES, "audio": {"voice": "nobody"}}, "audio.voice"),
        ({"messages": MESSAGES, "temperature": 7}, "temperature"),
        ({"messages": MESSAGES, "max_tokens": 0}, "max_tokens"),
        ({"messages": MESSAGES, "max_tokens": 10**7}, "max_tokens"),
        ({"messages": MESSAGES, "initial_codec_chunk_frames": 99}, "initial_codec_chunk_frames"),
        ({"messages": MESSAGES, "no_such_field": 1}, "no_such_field"),
    ],
)
def test_bad_requests_get_4xx_naming_the_field(gateway, body, field):
    reply = httpx.post(f"{_url(gateway)}/v1/chat/completions", json=body, timeout=30)
    assert 400 <= reply.status_code < 500, reply.text
    error = reply.json()["error"]
    assert error["param"] == field, error
    assert error["message"]


def test_malformed_json_gets_422_and_gateway_keeps_serving(gateway):
    reply = httpx.post(
        f"{_url(gateway)}/v1/chat/completions",
        content=b"{not json",
        timeout=30,
        headers={"Content-Type": "application/json"},
    )
    assert reply.status_code == 422 and "error" in reply.json()
    assert httpx.get(f"{_url(gateway)}/ready", timeout=5).status_code == 200


def test_models_health_ready_and_openapi(gateway):
    base = _url(gateway)
    assert httpx.get(f"{base}/health").json() == {"status": "ok"}
    assert httpx.get(f"{base}/ready").status_code == 200
    assert httpx.get(f"{base}/v1/models").json()["data"][0]["id"] == "qwen3-omni"
    schema = httpx.get(f"{base}/openapi.json").json()
    props = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "modalities", "audio", "stream", "max_tokens", "temperature", "top_p", "seed"} <= set(
        props
    )
    assert "/v1/chat/completions" in schema["paths"]
    metrics = httpx.get(f"{base}/metrics").text
    for name in (
        "omnistream_time_to_first_token_seconds",
        "omnistream_time_to_first_audio_seconds",
        "omnistream_inter_token_latency_seconds",
        "omnistream_e2e_latency_seconds",
        "omnistream_real_time_factor",
        "omnistream_requests_rejected_total",
        "omnistream_requests_finished_total",
    ):
        assert name in metrics


def test_example_config_loads():
    from pathlib import Path

    from gateway.config import GatewayConfig

    config = GatewayConfig.from_yaml(Path(__file__).resolve().parents[2] / "deploy" / "gateway.example.yaml")
    config.validate()
    assert len(config.talker) == 2 and config.queue_timeout == 5.0
    assert config.max_concurrency is None and config.max_queue is None  # derived from the stages


def test_same_prompt_and_seed_give_the_same_output_through_every_entry_point(
    gateway, stages, tiny_model_dir, tmp_path
):
    """REST, the gateway's gRPC API, `omnistream generate` and the stage services with codes: one
    request, sampled with the table's defaults and one seed (so the seed matters), gives the same
    text, token ids, codes and audio; the chunk plan is fixed so that load cannot change it."""
    seed, limits = 20261129, {"max_tokens": 24, "max_audio_frames": 40, "initial_codec_chunk_frames": 4}

    # omnistream generate: the in-process pipeline, as a user runs it.
    out = tmp_path / "generate"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in limits.items()]
    proc = subprocess.run(
        [sys.executable, "-m", "omnistream.cli.main", "generate", "--model", tiny_model_dir,
         "--dtype", "float64",
         "--prompt", MESSAGES[0]["content"], "--seed", str(seed), *flags, "--output-dir", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = (out / "text.txt").read_text(encoding="utf-8")
    output_ids = json.loads((out / "tokens.json").read_text())["output_ids"]
    codes = np.load(out / "codes.npy")
    audio, _ = read_float32_wav(out / "audio.wav")
    assert output_ids and codes.shape[1] > 0 and audio.size > 0

    # The stage services without the gateway, for the codes (clients never see them).
    request = resolve(RequestInput(messages=MESSAGES, seed=seed, **limits))
    assert not request.sampling.greedy and not request.talker_sampling.greedy
    svc_text, svc_codes, svc_audio, svc_done = asyncio.run(collect_services(stages, request, "seeded-1"))
    assert svc_done.output_ids == output_ids and svc_text == text
    np.testing.assert_array_equal(svc_codes, codes)
    np.testing.assert_array_equal(svc_audio, audio)

    # gRPC: a set `sampling` is read as sent, so the temperature is stated with the seed.
    async def grpc_run():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{gateway.port}") as channel:
            stub = gateway_pb2_grpc.GatewayStub(channel)
            call = stub.Generate(
                gateway_pb2.GenerateRequest(
                    messages=[common_pb2.Message(**m) for m in MESSAGES],
                    sampling=common_pb2.Sampling(temperature=1.0, seed=seed),
                    **limits,
                )
            )
            parts, ids, pcm = [], [], []
            async for event in call:
                if event.WhichOneof("event") == "text":
                    parts.append(event.text.text)
                    ids.extend(event.text.token_ids)
                elif event.WhichOneof("event") == "audio":
                    pcm.append(numpy_from_proto(event.audio.pcm, copy=True))
            return "".join(parts), ids, np.concatenate(pcm)

    grpc_text, grpc_ids, grpc_audio = asyncio.run(grpc_run())
    assert (grpc_text, grpc_ids) == (text, output_ids)
    np.testing.assert_array_equal(grpc_audio, audio)

    # REST, not streamed: the text, the token count and the audio as 16-bit PCM (what REST sends).
    body = {"messages": MESSAGES, "seed": seed, "audio": {"format": "pcm16"}, **limits}
    reply = httpx.post(f"{_url(gateway)}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    message = reply.json()["choices"][0]["message"]
    assert message["audio"]["transcript"] == text and message["content"] is None
    assert reply.json()["usage"]["completion_tokens"] == len(output_ids)
    assert base64.b64decode(message["audio"]["data"]) == to_pcm16(audio)

    # The seed is what made them equal: another one samples something else.
    other = resolve(RequestInput(messages=MESSAGES, seed=seed + 1, **limits))
    _, other_codes, _, other_done = asyncio.run(collect_services(stages, other, "seeded-2"))
    assert other_done.output_ids != output_ids or not np.array_equal(other_codes, codes)


def test_a_conversations_next_turn_reports_the_prompt_tokens_it_found_cached(gateway, stages):
    """Both stages' prefix caches: the thinker's as OpenAI reports it, usage.prompt_tokens_details.
    cached_tokens (turn 1 computes everything it has not seen; turn 2 starts as turn 1 did), and in
    its /metrics; the talker's (turn 2's talker prompt starts with turn 1's user rows) in its own."""
    url = f"{_url(gateway)}/v1/chat/completions"
    history = [
        {"role": "user", "content": "A conversation about the sea, the shore and the ships, turn one."}
    ]
    hit_tokens = "omnistream_stage_prefix_cache_hit_tokens_total"
    hits_before = metric(stages["thinker"], hit_tokens)
    body = {
        "max_tokens": 8,
        "max_audio_frames": 8,
        "modalities": ["text", "audio"],
        "audio": {"voice": "ethan", "format": "wav"},
    }
    first = httpx.post(url, json={"messages": history, **body}, timeout=120)
    assert first.status_code == 200, first.text
    history += [
        {"role": "assistant", "content": first.json()["choices"][0]["message"]["audio"]["transcript"]},
        {"role": "user", "content": "And turn two?"},
    ]
    talker_before = metric(stages["talker"], hit_tokens)
    second = httpx.post(url, json={"messages": history, **body}, timeout=120)
    assert second.status_code == 200, second.text
    usage = second.json()["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    # At least turn 1's prompt, in whole 16-token blocks; never the whole prompt (its last position
    # is computed to choose the first token).
    first_prompt = first.json()["usage"]["prompt_tokens"]
    assert first_prompt // 16 * 16 <= cached < usage["prompt_tokens"]
    hits = metric(stages["thinker"], hit_tokens) - hits_before
    assert hits >= cached
    # The talker's user rows of turn 1: its user turn, whatever came before it in this stack.
    assert metric(stages["talker"], hit_tokens) - talker_before >= 16
