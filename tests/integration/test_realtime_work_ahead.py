"""A turn's audio encoded while it is spoken (gateway/realtime/work_ahead.py), on the real processes:
a user speaks for seconds (espeak-ng speech streamed at real time) and commits; while they speak the
gateway sends the audio so far to the thinker, which encodes its complete encoder windows, and the
committed turn's request takes them, and its features are computed from the log-mel frames kept
while it was spoken. Its answer (transcript and audio, byte for byte, greedy,
float64 stages) is the one a gateway without work ahead gives the same audio, on both tiny builds
(the other seed and size and the real-shaped checkpoint in `make test-slow`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import (
    configured_gateway,
    gateway_idle,
    gateway_url,
    metric,
    metric_at,
    stages_on,
    wait_for,
)
from tests.integration.test_realtime_protocol import Client, b64, connect, opened
from tests.integration.test_realtime_speculation import GREEDY, answer
from tests.integration.test_realtime_voice_to_voice import stream
from tests.speech import silence_pcm16, speech_pcm16

API_KEY = "work-ahead-test-key"
# About 6 s of speech: three of the tiny checkpoints' 2 s encoder windows.
WORDS = (
    "The weather today is bright and clear over the sea, with a light wind from the west and a few "
    "small clouds drifting by in the afternoon."
)


@contextlib.contextmanager
def gateways(stages, directory: Path) -> Iterator[tuple]:
    """Two gateways over `stages`: with work ahead (the default) and without."""
    (directory / "on").mkdir()
    (directory / "off").mkdir()
    off = {"api_key": API_KEY, "realtime_work_ahead_ms": 0}
    with (
        configured_gateway(stages, directory / "on", {"api_key": API_KEY}) as on,
        configured_gateway(stages, directory / "off", off) as without,
    ):
        yield on, without


@pytest.fixture(scope="module", params=["stages", "ending_stages"])
def deployment(request, tmp_path_factory):
    stages = request.getfixturevalue(request.param)
    with gateways(stages, tmp_path_factory.mktemp(f"work-ahead-{request.param}")) as (on, off):
        yield on, off, stages


async def committed(gateway, pcm: bytes, live: bool) -> tuple[str, bytes]:
    """A session without turn detection hears `pcm` (`live`: at real time), commits it and asks for
    the answer."""
    async with connect(gateway, key=API_KEY) as ws:
        c: Client = await opened(ws)
        session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, **GREEDY}
        await c.send({"type": "session.update", "session": session})
        await c.until("session.updated")
        if live:
            await stream(c, pcm)
        else:
            await c.send({"type": "input_audio_buffer.append", "audio": b64(pcm)})
        await c.send({"type": "input_audio_buffer.commit"})
        await c.send({"type": "response.create"})
        return await answer(c)


def worked_ahead_as_without(on, off, stages) -> None:
    pcm = silence_pcm16(0.2) + speech_pcm16(WORDS) + silence_pcm16(0.3)
    thinker = stages["thinker"]
    reused = metric(thinker, "omnistream_stage_encoded_windows_reused_total")
    stored = metric(thinker, "omnistream_stage_encoded_windows_stored_total")
    frames = metric(thinker, "omnistream_stage_turn_frames_reused_total")
    text, audio = asyncio.run(committed(on, pcm, live=True))
    assert metric(thinker, "omnistream_stage_encoded_windows_stored_total") - stored >= 2
    assert metric(thinker, "omnistream_stage_encoded_windows_reused_total") - reused >= 2
    assert metric(thinker, "omnistream_stage_turn_frames_reused_total") == frames + 1  # its features
    assert metric_at(f"{gateway_url(on)}/metrics", "omnistream_realtime_work_ahead_total") >= 2
    assert audio and (text, audio) == asyncio.run(committed(off, pcm, live=False))
    assert asyncio.run(wait_for(lambda: gateway_idle(on, stages) and gateway_idle(off, stages), timeout=10))


def test_a_turn_encoded_while_spoken_answers_as_one_encoded_at_its_commit(deployment):
    worked_ahead_as_without(*deployment)


@pytest.mark.slow
@pytest.mark.parametrize("build", ["other_tiny_model_dir", "real_shaped_model_dir"])
def test_on_another_build_too(build, request, tmp_path):
    with stages_on(request.getfixturevalue(build)) as stages, gateways(stages, tmp_path) as (on, off):
        worked_ahead_as_without(on, off, stages)
