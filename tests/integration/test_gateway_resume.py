"""A thinker, talker or Code2Wav replica killed with SIGKILL under 8 streaming requests: every request
goes on at the sibling (gateway/serving/resume.py) and ends with the answer of a run without the kill,
to the byte of its text and audio, with no error; the resumes and their gaps are counted and nothing
leaks."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.request

import httpx
import numpy as np
import pytest
from openai import AsyncOpenAI

from omnistream.client import AsyncClient
from omnistream.client.events import AudioChunk, TextDelta

from .conftest import gateway_idle, gateway_url, metric, stack_beside, stage_args, wait_for

MESSAGES = [{"role": "user", "content": "Tell me a story about the sea."}]


def _requests(tokens: int) -> list[dict]:
    """Sampled text and voice, seeded: a resumed stage must draw what the lost one would have."""
    return [
        {
            "messages": [{"role": "user", "content": f"Tell me a story about the sea, part {i}."}],
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
            "max_audio_frames": 48,
            "initial_codec_chunk_frames": 2,
            "seed": 100 + i,
        }
        for i in range(8)
    ]


async def _stream(client: httpx.AsyncClient, base: str, body: dict, heard: asyncio.Event, kind: str) -> dict:
    """One streamed answer: its text, its audio (pcm16 bytes) and any error event."""
    text, audio, errors = [], bytearray(), []
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as reply:
        assert reply.status_code == 200
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            payload = json.loads(line[6:])
            if "error" in payload:
                errors.append(payload["error"])
                continue
            delta = payload["choices"][0]["delta"] if payload.get("choices") else {}
            said = delta.get("audio") or {}
            text.append(delta.get("content") or said.get("transcript") or "")
            if said.get("data"):
                audio += base64.b64decode(said["data"])
            if said.get("data" if kind == "audio" else "transcript"):
                heard.set()
    return {"text": "".join(text), "audio": bytes(audio), "errors": errors}


async def _answers(base: str, requests: list[dict], kill=None, kind: str = "audio") -> list[dict]:
    """The requests at once; `kill()` (run in a thread) once every one of them has some output of
    `kind` (audio; text)."""
    async with httpx.AsyncClient(timeout=180) as client:
        heard = [asyncio.Event() for _ in requests]
        pairs = zip(requests, heard, strict=True)
        streams = [asyncio.create_task(_stream(client, base, body, h, kind)) for body, h in pairs]
        if kill is not None:
            await asyncio.gather(*(h.wait() for h in heard))
            await asyncio.to_thread(kill)
        return await asyncio.gather(*streams)


def _labelled(base: str, name: str, **labels: str) -> float:
    body = urllib.request.urlopen(f"{base}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in body.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            total += float(match.group(2))
    return total


@pytest.mark.parametrize("stage", ["thinker", "talker", "code2wav"])
def test_a_replica_killed_under_8_streams_loses_no_answer(stages, tiny_model_dir, stage):
    """Two replicas of `stage` of its own, the session's other stages beside them; the replica that
    holds the most of the 8 requests is killed once every request has audio (a thinker: text, and
    answers long enough to be under way)."""
    own = {f"{stage}-{n}": stage_args(stage, tiny_model_dir) for n in ("a", "b")}
    shared = {name: stages[name] for name in ("thinker", "talker", "code2wav") if name != stage}
    kind = "text" if stage == "thinker" else "audio"
    requests = _requests(400 if stage == "thinker" else 24)  # a thinker still generating when killed
    with stack_beside(shared, own) as services:
        base = gateway_url(services["gateway"])
        want = asyncio.run(_answers(base, requests))
        assert all(not a["errors"] and a["audio"] for a in want), [a["errors"] for a in want]
        replicas = list(own)
        held = {}

        def kill_busiest() -> None:
            for name in replicas:
                held[name] = metric(services[name], "omnistream_stage_engine_requests")
            services[max(replicas, key=held.__getitem__)].kill()

        got = asyncio.run(_answers(base, requests, kill_busiest, kind))
        assert [a["errors"] for a in got] == [[]] * len(requests)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a["text"] == b["text"], i
            assert len(a["audio"]) == len(b["audio"]), (i, len(a["audio"]), len(b["audio"]))
            assert a["audio"] == b["audio"], i
        moved = max(held.values())
        assert moved >= 1, held
        resumed = _labelled(base, "omnistream_gateway_resumes_total", stage=stage, outcome="resumed")
        assert 1 <= resumed <= moved, (resumed, held)  # those it held then, less any that had ended
        gaps = _labelled(base, "omnistream_gateway_resume_gap_seconds_count", stage=stage)
        assert 1 <= gaps <= resumed
        alive = {n: s for n, s in services.items() if n != "gateway" and s.proc.poll() is None}
        assert asyncio.run(wait_for(lambda: gateway_idle(services["gateway"], alive), timeout=30.0))


async def _grpc_answer(address: str, kill=None) -> tuple[str, np.ndarray]:
    """One answer over omni.v1.Gateway/Generate; `kill()` (in a thread) at its first audio."""
    text, audio = [], []
    async with AsyncClient(address) as client:
        options = {"seed": 5, "max_tokens": 24, "ignore_eos": True, "max_audio_frames": 48}
        async for event in client.generate(MESSAGES, initial_codec_chunk_frames=2, **options):
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, AudioChunk):
                audio.append(event.samples)
                if kill is not None and len(audio) == 1:
                    await asyncio.to_thread(kill)
    return "".join(text), np.concatenate(audio)


async def _realtime_answer(base: str, kill=None) -> tuple[str, str, bytes]:
    """One typed turn's spoken answer over /v1/realtime (the openai SDK); `kill()` at its first audio."""
    client = AsyncOpenAI(base_url=f"{base}/v1", api_key="unused")
    async with client.realtime.connect(model="omnistream") as conn:
        await conn.recv()
        extension = {"seed": 5, "max_audio_frames": 48}
        session = {"type": "realtime", "audio": {"input": {"turn_detection": None}}, "omnistream": extension}
        await conn.session.update(session=session)
        assert (await conn.recv()).type == "session.updated"
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "The sea?"}]}
        await conn.conversation.item.create(item=item)
        await conn.response.create(response={"max_output_tokens": 24})
        transcript, audio = [], bytearray()
        async with asyncio.timeout(120):
            async for event in conn:
                if event.type == "response.output_audio.delta":
                    audio += base64.b64decode(event.delta)
                    if kill is not None and len(audio) == len(base64.b64decode(event.delta)):
                        await asyncio.to_thread(kill)
                elif event.type == "response.output_audio_transcript.delta":
                    transcript.append(event.delta)
                elif event.type == "response.done":
                    return event.response.status, "".join(transcript), bytes(audio)
    raise AssertionError("the session closed before response.done")


def test_grpc_and_realtime_answers_survive_a_killed_talker(stages, tiny_model_dir):
    """Three talkers of its own: one killed at the first audio of a gRPC answer, another at the first
    audio of a realtime answer; each answer is whole and the one a run without the kill gives."""
    own = {f"talker-{n}": stage_args("talker", tiny_model_dir) for n in ("a", "b", "c")}
    shared = {name: stages[name] for name in ("thinker", "code2wav")}
    with stack_beside(shared, own) as services:
        gateway = services["gateway"]
        base, address = gateway_url(gateway), f"127.0.0.1:{gateway.port}"

        def kill_busy() -> None:
            alive = [n for n in own if services[n].proc.poll() is None]
            busy = [n for n in alive if metric(services[n], "omnistream_stage_engine_requests")]
            assert len(busy) == 1, busy
            services[busy[0]].kill()

        text, audio = asyncio.run(_grpc_answer(address))
        got_text, got_audio = asyncio.run(_grpc_answer(address, kill_busy))
        assert got_text == text
        np.testing.assert_array_equal(got_audio, audio)

        want = asyncio.run(_realtime_answer(base))
        assert want[0] == "incomplete" and want[2]  # it ran to max_output_tokens, with audio
        assert asyncio.run(_realtime_answer(base, kill_busy)) == want
        assert [services[n].proc.poll() is None for n in own].count(True) == 1
        resumed = _labelled(base, "omnistream_gateway_resumes_total", stage="talker", outcome="resumed")
        assert resumed == 2


def test_a_resumed_request_keeps_its_deadline_and_leaves_nothing(stages, tiny_model_dir):
    """A request moved to a sibling is still the same request: its timeout runs from its start, it
    ends with deadline_exceeded when that passes, and nothing of it stays anywhere."""
    own = {f"talker-{n}": stage_args("talker", tiny_model_dir) for n in ("a", "b")}
    shared = {name: stages[name] for name in ("thinker", "code2wav")}
    with stack_beside(shared, own) as services:
        base = gateway_url(services["gateway"])
        body = {**_requests(2000)[0], "max_audio_frames": 2000, "timeout": 4}

        def kill_busy() -> None:
            busy = [n for n in own if metric(services[n], "omnistream_stage_engine_requests")]
            services[busy[0]].kill()

        (answer,) = asyncio.run(_answers(base, [body], kill_busy))
        assert [e["code"] for e in answer["errors"]] == ["deadline_exceeded"], answer["errors"]
        assert _labelled(base, "omnistream_gateway_resumes_total", stage="talker", outcome="resumed") == 1
        alive = {n: s for n, s in services.items() if n != "gateway" and s.proc.poll() is None}
        assert asyncio.run(wait_for(lambda: gateway_idle(services["gateway"], alive), timeout=30.0))
