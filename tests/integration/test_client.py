"""The Python clients, `omnistream chat` and the Node example against the real processes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from omnistream.audio.wav import float32_wav_bytes, to_pcm16
from omnistream.client import (
    AsyncClient,
    AsyncRestClient,
    AudioChunk,
    Client,
    DeadlineExceeded,
    InvalidRequest,
    RestClient,
    TextDelta,
    media,
)

from .conftest import gateway_idle, gateway_process, gateway_url, wait_for

PROMPT = "Tell me about rivers and the sea."
# Sampled, not greedy: the seed must decide the answer, the same way through every client.
SEEDED = {"seed": 11, "max_tokens": 24, "max_audio_frames": 40, "initial_codec_chunk_frames": 4}
LONG = {"max_tokens": 400, "ignore_eos": True, "max_audio_frames": 400, "initial_codec_chunk_frames": 2}
NODE_DIR = Path(__file__).resolve().parents[2] / "examples" / "node"


@pytest.fixture(scope="module")
def gateway(stages):
    with gateway_process(stages) as gateway:
        yield gateway


@pytest.fixture(scope="module")
def reference(gateway):
    """The seeded answer through the blocking gRPC client."""
    with Client(gateway.address) as client:
        result = client.complete(PROMPT, **SEEDED)
    assert result.text and result.audio.size and result.finish_reason
    return result


def test_sync_async_and_rest_clients_get_the_same_answer(gateway, reference):
    async def through_async():
        async with AsyncClient(gateway.address) as client:
            grpc_result = await client.complete(PROMPT, **SEEDED)
        async with AsyncRestClient(gateway_url(gateway)) as client:
            rest_result = await client.complete(PROMPT, **SEEDED)
        return grpc_result, rest_result

    async_result, async_rest = asyncio.run(through_async())
    with RestClient(gateway_url(gateway)) as client:
        rest = client.complete(PROMPT, **SEEDED)

    assert async_result.text == reference.text == rest.text == async_rest.text
    assert async_result.token_ids == reference.token_ids
    np.testing.assert_array_equal(async_result.audio, reference.audio)  # float32, bit for bit
    assert async_result.sample_rate == reference.sample_rate == 24000
    # REST carries 16-bit PCM: the same samples, quantised.
    assert to_pcm16(rest.audio) == to_pcm16(reference.audio) == to_pcm16(async_rest.audio)
    assert reference.usage is not None and reference.usage.completion_tokens == len(reference.token_ids)
    assert reference.usage.audio_samples == reference.audio.size


def test_another_seed_gives_another_answer(gateway, reference):
    with Client(gateway.address) as client:
        other = client.complete(PROMPT, **{**SEEDED, "seed": 12})
    assert other.token_ids != reference.token_ids


def test_leaving_the_sync_loop_cancels_the_request_everywhere(gateway, stages):
    with Client(gateway.address) as client:
        for event in client.generate(PROMPT, **LONG):
            if isinstance(event, AudioChunk):
                break  # the generator is closed here, which cancels the call
        assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=30.0, interval=0.2))


def test_leaving_the_async_loop_cancels_the_request_everywhere(gateway, stages):
    async def run():
        async with AsyncClient(gateway.address) as client:
            async with contextlib.aclosing(client.generate(PROMPT, **LONG)) as events:
                async for event in events:
                    if isinstance(event, AudioChunk):
                        break
            return await wait_for(lambda: gateway_idle(gateway, stages), timeout=30.0, interval=0.2)

    assert asyncio.run(run())


def test_a_deadline_is_a_typed_timeout_error(gateway, stages):
    with Client(gateway.address) as client, pytest.raises(DeadlineExceeded) as raised:
        client.complete(PROMPT, deadline=0.5, **LONG)
    assert raised.value.kind == "deadline_exceeded"

    async def run():
        async with AsyncClient(gateway.address) as client:
            with pytest.raises(DeadlineExceeded):
                await client.complete(PROMPT, timeout=0.5, **LONG)  # the gateway's own timeout

    asyncio.run(run())
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=30.0, interval=0.2))


def test_a_bad_request_is_a_typed_error_naming_the_field(gateway):
    with Client(gateway.address) as client, pytest.raises(InvalidRequest) as raised:
        client.complete(PROMPT, voice="nobody", max_tokens=4)
    assert "voice" in raised.value.message
    with RestClient(gateway_url(gateway)) as client, pytest.raises(InvalidRequest) as rest_raised:
        client.complete(PROMPT, voice="nobody", max_tokens=4)
    assert rest_raised.value.http_status == 422


def _read_float32_wav(path: Path) -> np.ndarray:
    data = path.read_bytes()
    at = data.index(b"data") + 8
    return np.frombuffer(data[at:], dtype="<f4")


def test_chat_writes_the_clients_samples_and_the_rest_text(gateway, reference, tmp_path):
    out = tmp_path / "answer.wav"
    args = [
        sys.executable,
        "-m",
        "omnistream.cli.main",
        "chat",
        "--gateway",
        gateway.address,
        "--output",
        str(out),
    ]
    args += ["--seed", "11", "--max-tokens", "24", "--max-audio-frames", "40"]
    args += ["--initial-codec-chunk-frames", "4"]
    # Two turns read from stdin: the first must equal the client's answer; the second has history.
    done = subprocess.run(
        args, input=f"{PROMPT}\nAnd the mountains?\n", capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == reference.text
    np.testing.assert_array_equal(_read_float32_wav(tmp_path / "answer-1.wav"), reference.audio)
    assert (tmp_path / "answer-1.wav").read_bytes() == float32_wav_bytes(reference.audio, 24000)
    assert (tmp_path / "answer-2.wav").stat().st_size > 100
    assert done.stderr.count("first token") == 2 and "first audio" in done.stderr


@pytest.fixture(scope="module")
def node_client():
    node, npm = shutil.which("node"), shutil.which("npm")
    if not (node and npm):
        pytest.skip("node and npm are not installed (the Node example is tested where they are)")
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").exists():
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=300, capture_output=True
        )
    return node


def test_node_example_writes_the_python_clients_wav(gateway, reference, node_client, tmp_path):
    out = tmp_path / "node.wav"
    args = [node_client, str(NODE_DIR / "client.js"), "--gateway", gateway.address, "--prompt", PROMPT]
    args += ["--out", str(out), "--seed", "11", "--max-tokens", "24", "--max-audio-frames", "40"]
    args += ["--initial-codec-chunk-frames", "4"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == reference.text.strip()
    assert out.read_bytes() == float32_wav_bytes(reference.audio, reference.sample_rate)


def test_events_arrive_typed_and_in_order(gateway):
    kinds = []
    with Client(gateway.address) as client:
        for event in client.generate(PROMPT, **SEEDED):
            kinds.append(type(event).__name__)
    assert kinds[-2:] == ["Usage", "End"]
    assert "TextDelta" in kinds and "AudioChunk" in kinds
    assert TextDelta.__name__ in kinds[: kinds.index("Usage")]


def test_clients_send_media_parts(gateway):
    """A sound file and a picture through the gRPC client (encoded parts the gateway decodes), and the
    same through REST: both answer."""
    from tests.media_files import audio_file, image_file

    content = [
        media(audio_file("wav", seconds=0.5), kind="audio", mime_type="audio/wav"),
        media(image_file(), kind="image", mime_type="image/png"),
        {"type": "text", "text": "What is this?"},
    ]
    turn = [{"role": "user", "content": content}]
    with Client(gateway.address) as client:
        answer = client.complete(turn, max_tokens=6, audio=False, temperature=0)
    with RestClient(gateway_url(gateway)) as rest:
        same = rest.complete(turn, max_tokens=6, audio=False, temperature=0)
    assert answer.text and answer.token_ids and answer.text == same.text
