"""A talker or Code2Wav replica killed with SIGKILL under 8 streaming requests: every request goes on
at the sibling (gateway/serving/resume.py) and ends with the answer of a run without the kill, to the
byte of its text and audio, with no error; the resumes and their gaps are counted and nothing leaks."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import urllib.request

import httpx
import pytest

from .conftest import gateway_idle, gateway_url, metric, stack_beside, stage_args, wait_for

# Sampled text and voice, seeded: a resumed talker must draw what the lost one would have.
REQUESTS = [
    {
        "messages": [{"role": "user", "content": f"Tell me a story about the sea, part {i}."}],
        "max_tokens": 24,
        "ignore_eos": True,
        "stream": True,
        "max_audio_frames": 48,
        "initial_codec_chunk_frames": 2,
        "seed": 100 + i,
    }
    for i in range(8)
]


async def _stream(client: httpx.AsyncClient, base: str, body: dict, heard: asyncio.Event) -> dict:
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
                heard.set()
    return {"text": "".join(text), "audio": bytes(audio), "errors": errors}


async def _answers(base: str, kill=None) -> list[dict]:
    """The 8 requests at once; `kill()` (run in a thread) once every one of them has audio."""
    async with httpx.AsyncClient(timeout=180) as client:
        heard = [asyncio.Event() for _ in REQUESTS]
        pairs = zip(REQUESTS, heard, strict=True)
        streams = [asyncio.create_task(_stream(client, base, body, h)) for body, h in pairs]
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


@pytest.mark.parametrize("stage", ["talker", "code2wav"])
def test_a_replica_killed_under_8_streams_loses_no_answer(stages, tiny_model_dir, stage):
    """Two replicas of `stage` of its own, the session's other stages beside them; the replica that
    holds the most of the 8 requests is killed once every request has audio."""
    other = "code2wav" if stage == "talker" else "talker"
    own = {f"{stage}-{n}": stage_args(stage, tiny_model_dir) for n in ("a", "b")}
    shared = {name: stages[name] for name in ("thinker", other)}
    with stack_beside(shared, own) as services:
        base = gateway_url(services["gateway"])
        want = asyncio.run(_answers(base))
        assert all(not a["errors"] and a["audio"] for a in want), [a["errors"] for a in want]
        replicas = list(own)
        held = {}

        def kill_busiest() -> None:
            for name in replicas:
                held[name] = metric(services[name], "omnistream_stage_engine_requests")
            services[max(replicas, key=held.__getitem__)].kill()

        got = asyncio.run(_answers(base, kill_busiest))
        assert [a["errors"] for a in got] == [[]] * len(REQUESTS)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert a["text"] == b["text"], i
            assert len(a["audio"]) == len(b["audio"]), (i, len(a["audio"]), len(b["audio"]))
            assert a["audio"] == b["audio"], i
        moved = max(held.values())
        assert moved >= 1, held
        resumed = _labelled(base, "omnistream_gateway_resumes_total", stage=stage, outcome="resumed")
        assert resumed >= moved, (resumed, held)
        gaps = _labelled(base, "omnistream_gateway_resume_gap_seconds_count", stage=stage)
        assert 1 <= gaps <= resumed
        alive = {n: s for n, s in services.items() if n != "gateway" and s.proc.poll() is None}
        assert asyncio.run(wait_for(lambda: gateway_idle(services["gateway"], alive), timeout=30.0))
