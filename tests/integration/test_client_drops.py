"""One client leaving never fails another's request, on the real processes (issue 28).

Streamed `POST /v1/audio/speech` requests run 8 at a time, each client leaving at a random point
(before the answer, right after its headers, after 1, 500, 5,000 or 20,000 bytes, or never); every
request that was not dropped must end with its whole file, and afterwards no stage holds anything
(the stages' request gauges read from their /metrics). The small run is in `make test`; a
1,000-request run is `@pytest.mark.slow`.

Then chat completions, speech and realtime turns mixed, 8 at a time, clients leaving at random:
every request that was not dropped gets exactly the answer (text and audio) the same request got
alone (seeded sampling, one chunk plan), so no state of a departed request reached another.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import os
import random
import re
import urllib.request
from dataclasses import dataclass

import httpx
import pytest
import websockets

from .conftest import configured_gateway, gateway_idle, gateway_url, metric, wait_for

TEXT = "Hello there, this is a test of the speech path."
FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
MAGIC = {"mp3": b"ID3", "opus": b"OggS", "aac": b"\xff\xf1", "flac": b"fLaC", "wav": b"RIFF"}
# None: the client reads the whole answer; "early": it leaves before the answer's headers.
LEAVE_POINTS: tuple[int | str | None, ...] = ("early", 0, 1, 500, 5_000, 20_000, None)
CONCURRENCY = 8
SPEECH_DROP_REQUESTS = int(os.environ.get("OMNISTREAM_SPEECH_DROP_REQUESTS", "48"))
SLOW_SPEECH_DROP_REQUESTS = int(os.environ.get("OMNISTREAM_SLOW_SPEECH_DROP_REQUESTS", "1000"))
# Stage gauges that must all read 0 once every client is gone.
STAGE_GAUGES = (
    "engine_requests",
    "orphaned_requests",
    "open_streams",
    "running_requests",
    "waiting_requests",
)


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    # Room for every client at once (no 429 is a failure of the load, not of the fault under test);
    # and so much that the load never changes the realtime turns' chunk plan (the smallest first
    # chunk, INITIAL_FRAMES, as the other requests ask for).
    config = {"max_concurrency": 128}
    with configured_gateway(stages, tmp_path_factory.mktemp("drops"), config) as gw:
        yield gw


@dataclass
class Outcome:
    leave: int | str | None
    fmt: str
    failure: str | None = None  # what went wrong, for a request that was owed its answer
    left: bool = False  # the client left as planned, before the end


async def _speech(client: httpx.AsyncClient, url: str, body: dict, leave: int | str | None) -> Outcome:
    """One streamed speech request whose client leaves at `leave` (bytes of body read)."""
    outcome = Outcome(leave, body["response_format"])
    try:
        async with client.stream("POST", url, json=body) as reply:
            if reply.status_code != 200:
                await reply.aread()
                outcome.failure = f"HTTP {reply.status_code}: {reply.text[:300]}"
                return outcome
            if leave == 0:
                outcome.left = True
                return outcome
            data = bytearray()
            async for piece in reply.aiter_raw():
                data += piece
                if isinstance(leave, int) and len(data) >= leave:
                    outcome.left = True
                    return outcome
        magic = MAGIC.get(outcome.fmt)
        if not data or (magic and not data.startswith(magic)) or (outcome.fmt == "pcm" and len(data) % 2):
            outcome.failure = f"an incomplete {outcome.fmt} file of {len(data)} bytes"
    except httpx.HTTPError as exc:
        outcome.failure = f"{type(exc).__name__}: {exc}"
    return outcome


async def _speech_load(gateway, requests: int, seed: int) -> list[Outcome]:
    rng = random.Random(seed)
    url = f"{gateway_url(gateway)}/v1/audio/speech"
    plans = [
        (
            {
                "model": "qwen3-omni",
                "input": TEXT,
                "voice": "ethan",
                "response_format": rng.choice(FORMATS),
                "max_audio_frames": rng.randint(10, 60),
            },
            rng.choice(LEAVE_POINTS),
            rng.uniform(0.0, 0.05),
        )
        for _ in range(requests)
    ]
    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY * 2)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(body: dict, leave: int | str | None, early: float) -> Outcome:
            async with gate:
                if leave != "early":
                    return await _speech(client, url, body, leave)
                try:  # gone before the answer: while it is admitted, prefilled, or first decoded
                    return await asyncio.wait_for(_speech(client, url, body, None), early)
                except TimeoutError:
                    return Outcome(leave, body["response_format"], left=True)

        return await asyncio.gather(*(one(*plan) for plan in plans))


def _stages_hold_nothing(stages) -> bool:
    return all(metric(s, f"omnistream_stage_{g}") == 0 for s in stages.values() for g in STAGE_GAUGES)


def labelled(url: str, name: str, label: str) -> collections.Counter:
    """A counter's samples by the value of one label (e.g. requests finished, by status)."""
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    found: collections.Counter = collections.Counter()
    for line in body.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            found[labels.get(label, "")] += float(match.group(2))
    return found


def _errors(gateway, stages) -> collections.Counter:
    """What has failed so far: the gateway's requests by final status (but ok: an answer; and
    cancelled: the client left), and every stage's errors by kind."""
    ended = labelled(f"{gateway_url(gateway)}/metrics", "omnistream_requests_finished_total", "status")
    errors = collections.Counter(
        {f"gateway {status}": n for status, n in ended.items() if status not in ("ok", "cancelled")}
    )
    for name, s in stages.items():
        url = f"http://{s.connect_host}:{s.metrics_port}/metrics"
        for kind, count in labelled(url, "omnistream_stage_errors_total", "kind").items():
            errors[f"{name} {kind}"] += count
    return errors


def _check_speech_drops(gateway, stages, requests: int, seed: int) -> None:
    before = _errors(gateway, stages)
    outcomes = asyncio.run(_speech_load(gateway, requests, seed))
    failures = [o for o in outcomes if o.failure is not None]
    summary = collections.Counter(o.failure.split(":")[0] for o in failures)
    detail = "\n".join(f"  leave={o.leave} {o.fmt}: {o.failure}" for o in failures[:10])
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=30, interval=0.2))
    # A request that failed before its client left is a failure too, though no client saw it.
    failed = _errors(gateway, stages) - before
    assert not failures and not failed, (
        f"{len(failures)} of {requests} speech requests owed an answer failed ({dict(summary)}); "
        f"failures counted by the services: {dict(failed)}\n{detail}"
    )
    # The load meant something: clients left at every kind of point, and others got whole answers.
    assert sum(o.left for o in outcomes) > 0 and sum(not o.left for o in outcomes) > 0
    assert _stages_hold_nothing(stages)


def test_speech_clients_leaving_never_fail_another_speech(gateway, stages):
    _check_speech_drops(gateway, stages, SPEECH_DROP_REQUESTS, seed=28)


@pytest.mark.slow
def test_a_thousand_speech_requests_with_drops_never_fail_another(gateway, stages):
    _check_speech_drops(gateway, stages, SLOW_SPEECH_DROP_REQUESTS, seed=2028)


# --- chat, speech and realtime mixed ---------------------------------------------------------------

MIXED_REQUESTS = int(os.environ.get("OMNISTREAM_MIXED_DROP_REQUESTS", "60"))
SLOW_MIXED_REQUESTS = int(os.environ.get("OMNISTREAM_SLOW_MIXED_DROP_REQUESTS", "300"))
INITIAL_FRAMES = 2  # the first chunk's frames: what the dynamic plan picks at this load, stated


@dataclass(frozen=True)
class Template:
    """One request, sent alone first and then many times under the load: seeded, so its answer
    (text and audio) is one fixed thing."""

    kind: str  # chat, speech or realtime
    text: str
    seed: int
    frames: int
    tokens: int = 12


TEMPLATES = (
    Template("chat", "Tell me about rivers.", 11, 24),
    Template("chat", "What is the sea like at night?", 12, 16),
    Template("speech", TEXT, 13, 20),
    Template("speech", "The boats came home late.", 14, 12),
    Template("realtime", "Sing me something short.", 15, 18),
    Template("realtime", "Describe a mountain.", 16, 10),
)


@dataclass
class Answer:
    text: str
    audio: bytes


class Left(Exception):
    """The client leaves here, as planned."""


def _leave_at(count: int, leave: int | None) -> None:
    if leave is not None and count >= leave:
        raise Left


async def _chat(client: httpx.AsyncClient, base: str, t: Template, leave: int | None) -> Answer:
    """A streamed chat completion with audio; `leave`: the client goes after that many events."""
    body = {
        "messages": [{"role": "user", "content": t.text}],
        "stream": True,
        "seed": t.seed,
        "max_tokens": t.tokens,
        "max_audio_frames": t.frames,
        "initial_codec_chunk_frames": INITIAL_FRAMES,
        "audio": {"format": "pcm16"},
    }
    text, audio, events = [], bytearray(), 0
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as reply:
        if reply.status_code != 200:
            await reply.aread()
            raise AssertionError(f"HTTP {reply.status_code}: {reply.text[:300]}")
        _leave_at(events, leave)
        async for line in reply.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise AssertionError(f"error event: {event['error']}")
            delta = event["choices"][0]["delta"].get("audio") or {}
            text.append(delta.get("transcript", ""))
            audio += base64.b64decode(delta.get("data", ""))
            events += 1
            _leave_at(events, leave)
    return Answer("".join(text), bytes(audio))


async def _speech_answer(client: httpx.AsyncClient, base: str, t: Template, leave: int | None) -> Answer:
    """A streamed pcm speech; `leave`: the client goes after that many bytes."""
    body = {
        "input": t.text,
        "voice": "ethan",
        "response_format": "pcm",
        "seed": t.seed,
        "max_audio_frames": t.frames,
        "initial_codec_chunk_frames": INITIAL_FRAMES,
    }
    audio = bytearray()
    async with client.stream("POST", f"{base}/v1/audio/speech", json=body) as reply:
        if reply.status_code != 200:
            await reply.aread()
            raise AssertionError(f"HTTP {reply.status_code}: {reply.text[:300]}")
        _leave_at(0, leave)
        async for piece in reply.aiter_raw():
            audio += piece
            _leave_at(len(audio), leave)
    return Answer("", bytes(audio))


async def _realtime(base: str, t: Template, leave: int | None) -> Answer:
    """One text turn in a realtime session of its own; `leave`: the client closes the socket
    after that many events of the response."""
    url = base.replace("http://", "ws://") + "/v1/realtime?model=omnistream"
    text, audio, events = [], bytearray(), 0
    async with websockets.connect(url, max_size=None, open_timeout=30) as ws:

        async def until(kind: str) -> dict:
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if event["type"] == "error":
                    raise AssertionError(f"realtime error: {event['error']}")
                if event["type"] == kind:
                    return event

        await until("session.created")
        session = {
            "type": "realtime",
            "audio": {"input": {"turn_detection": None}},
            "max_output_tokens": t.tokens,
            "omnistream": {"seed": t.seed, "max_audio_frames": t.frames},
        }
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await until("session.updated")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t.text}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await until("conversation.item.done")
        await ws.send(json.dumps({"type": "response.create"}))
        await until("response.created")
        _leave_at(events, leave)
        while True:
            event = json.loads(await asyncio.wait_for(ws.recv(), 120))
            kind = event["type"]
            if kind == "error":
                raise AssertionError(f"realtime error: {event['error']}")
            if kind == "response.output_audio_transcript.delta":
                text.append(event["delta"])
            elif kind == "response.output_audio.delta":
                audio += base64.b64decode(event["delta"])
            elif kind == "response.done":
                status = event["response"]["status"]
                reason = (event["response"].get("status_details") or {}).get("reason")
                if status != "completed" and reason != "max_output_tokens":
                    raise AssertionError(f"realtime response ended {status} ({reason})")
                return Answer("".join(text), bytes(audio))
            events += 1
            _leave_at(events, leave)


async def _run(client: httpx.AsyncClient, base: str, t: Template, leave: int | None) -> Answer:
    if t.kind == "chat":
        return await _chat(client, base, t, leave)
    if t.kind == "speech":
        return await _speech_answer(client, base, t, leave)
    return await _realtime(base, t, leave)


LEAVES = {"chat": (0, 1, 2, 3, 5), "speech": (0, 1, 500, 5_000), "realtime": (0, 1, 2, 3, 5)}


async def _mixed(gateway, requests: int, seed: int) -> tuple[dict[Template, Answer], list[str], int]:
    """The answers alone, then the mixed load: (references, failures, requests that survived)."""
    base = gateway_url(gateway)
    rng = random.Random(seed)
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=32)) as client:
        alone = {t: await _run(client, base, t, None) for t in TEMPLATES}
        plans = []
        for _ in range(requests):
            t = rng.choice(TEMPLATES)
            plans.append((t, rng.choice(LEAVES[t.kind]) if rng.random() < 0.6 else None))
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(t: Template, leave: int | None) -> str | None:
            async with gate:
                try:
                    answer = await _run(client, base, t, leave)
                except Left:
                    return None
                except (AssertionError, httpx.HTTPError, websockets.WebSocketException, TimeoutError) as exc:
                    return f"{t.kind} {t.seed} leave={leave}: {type(exc).__name__}: {exc}"
                want = alone[t]
                if answer.text != want.text or answer.audio != want.audio:
                    return (
                        f"{t.kind} {t.seed}: another answer than alone (text {answer.text!r} vs "
                        f"{want.text!r}; audio {len(answer.audio)} vs {len(want.audio)} bytes, "
                        f"equal: {answer.audio == want.audio})"
                    )
                return "ok"

        results = await asyncio.gather(*(one(*plan) for plan in plans))
    failures = [r for r in results if r not in (None, "ok")]
    return alone, failures, sum(r == "ok" for r in results)


def _check_mixed(gateway, stages, requests: int, seed: int) -> None:
    before = _errors(gateway, stages)
    alone, failures, survived = asyncio.run(_mixed(gateway, requests, seed))
    for t, answer in alone.items():  # the references mean something: a voice, and words
        assert len(answer.audio) > 0 and (t.kind == "speech" or answer.text), t
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), timeout=30, interval=0.2))
    failed = _errors(gateway, stages) - before
    detail = "\n".join(f"  {f}" for f in failures[:10])
    assert not failures and not failed, (
        f"{len(failures)} of {survived + len(failures)} requests not dropped failed; failures counted "
        f"by the services: {dict(failed)}\n{detail}"
    )
    assert 0 < survived < requests
    assert _stages_hold_nothing(stages)


def test_chat_speech_and_realtime_survivors_get_the_answer_they_get_alone(gateway, stages):
    _check_mixed(gateway, stages, MIXED_REQUESTS, seed=280)


@pytest.mark.slow
def test_many_mixed_requests_with_drops_get_the_answer_they_get_alone(gateway, stages):
    _check_mixed(gateway, stages, SLOW_MIXED_REQUESTS, seed=2280)
