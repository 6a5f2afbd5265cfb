"""The gateway when stage processes die: replicas share load and take over, a kill -9 mid-stream
ends that stream with an explicit error, and the surviving stages hold nothing."""

from __future__ import annotations

import asyncio
import json

import httpx

from .conftest import gateway_url, metric, replicated_stack, stack_beside, stage_args, wait_for

MESSAGES = [{"role": "user", "content": "Tell me a story about the sea."}]


def test_replicas_share_load_and_survive_a_kill(stages, tiny_model_dir):
    """Two talker replicas of its own (one is killed) beside the session's thinker and code2wav."""
    talkers = {name: stage_args("talker", tiny_model_dir) for name in ("talker-a", "talker-b")}
    shared = {name: stages[name] for name in ("thinker", "code2wav")}
    with stack_beside(shared, talkers) as services:
        base = gateway_url(services["gateway"])
        body = {
            "messages": MESSAGES,
            "max_tokens": 8,
            "modalities": ["text", "audio"],
            "max_audio_frames": 10,
            "talker_temperature": 0,
        }

        async def burst(n: int) -> list[int]:
            async with httpx.AsyncClient(timeout=120) as client:
                replies = await asyncio.gather(
                    *(client.post(f"{base}/v1/chat/completions", json=body) for _ in range(n))
                )
                return [r.status_code for r in replies]

        assert asyncio.run(burst(4)) == [200] * 4
        served = {s: metric(services[s], "omnistream_stage_requests_total") for s in ("talker-a", "talker-b")}
        assert all(count >= 2 for count in served.values()), served  # warm-up is not counted there
        services["talker-a"].kill()
        codes = asyncio.run(burst(4))
        assert codes == [200] * 4, codes
        assert metric(services["talker-b"], "omnistream_stage_requests_total") >= served["talker-b"] + 4


def _delta_has(delta: dict, kind: str) -> bool:
    audio = delta.get("audio") or {}
    if kind == "audio":
        return bool(audio.get("data"))
    return bool(delta.get("content") or audio.get("transcript"))


def _stream_until_then_kill(base: str, body: dict, kind: str, victim) -> list[dict]:
    """Stream `body`; at the first delta of `kind` ("content": text, which with audio is OpenAI's
    `audio.transcript`; "audio": audio data) kill -9 `victim()`; return every SSE payload after that
    (the stream must end, with an error, instead of hanging)."""
    after: list[dict] = []
    killed = False
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                after.append({"done": True})
                break
            payload = json.loads(line[6:])
            if killed:
                after.append(payload)
            elif payload.get("choices") and _delta_has(payload["choices"][0]["delta"], kind):
                victim().kill()
                killed = True
    assert killed
    return after


def test_kill_9_mid_stream_ends_with_an_error_and_frees_the_rest(tiny_model_dir):
    """A talker replica killed with SIGKILL while it streams: the request goes on at the other one
    (gateway/serving/resume.py) and ends whole. Then the last talker, then the thinker, killed while
    they stream, with no sibling left: the client gets an explicit error and [DONE] (no hang, no
    truncated success), and the surviving stages hold nothing."""
    with replicated_stack(tiny_model_dir) as services:
        base = gateway_url(services["gateway"])
        long = {
            "messages": MESSAGES,
            "max_tokens": 400,
            "ignore_eos": True,
            "stream": True,
            "max_audio_frames": 400,
            "initial_codec_chunk_frames": 2,
        }

        def busy_talker():
            for name in ("talker-a", "talker-b"):
                alive = services[name].proc.poll() is None
                if alive and metric(services[name], "omnistream_stage_engine_requests"):
                    return services[name]
            raise AssertionError("no talker holds the request")

        after = _stream_until_then_kill(base, long, "audio", busy_talker)
        assert not [p["error"] for p in after if "error" in p], after[-3:]
        assert after[-1] == {"done": True}
        finish = [p["choices"][0].get("finish_reason") for p in after if p.get("choices")]
        assert "length" in finish, after[-3:]

        def survivors_idle(names) -> bool:
            return all(
                metric(services[n], "omnistream_stage_engine_requests") == 0
                and metric(services[n], "omnistream_stage_open_streams") == 0
                for n in names
            )

        talkers = [n for n in ("talker-a", "talker-b") if services[n].proc.poll() is None]
        assert len(talkers) == 1
        assert asyncio.run(wait_for(lambda: survivors_idle(("thinker", "code2wav", *talkers)), timeout=30.0))

        # The last talker dies while it streams: no sibling, so the loss is the answer.
        after = _stream_until_then_kill(base, long, "audio", busy_talker)
        errors = [p["error"] for p in after if "error" in p]
        assert errors and errors[0]["code"] in ("unavailable", "internal"), after[-3:]
        assert after[-1] == {"done": True}
        assert asyncio.run(wait_for(lambda: survivors_idle(("thinker", "code2wav")), timeout=30.0))

        # Text alone still runs; now the thinker dies while it streams text.
        text = {**long, "modalities": ["text"]}
        after = _stream_until_then_kill(base, text, "content", lambda: services["thinker"])
        errors = [p["error"] for p in after if "error" in p]
        assert errors and errors[0]["code"] in ("unavailable", "internal"), after[-3:]
        assert after[-1] == {"done": True}
        assert asyncio.run(wait_for(lambda: survivors_idle(("code2wav",)), timeout=30.0))
        # With no thinker left the gateway says so instead of accepting work.
        assert asyncio.run(
            wait_for(lambda: httpx.get(f"{base}/ready", timeout=5).status_code == 503, timeout=30.0)
        )
