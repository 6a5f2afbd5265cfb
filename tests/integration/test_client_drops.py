"""One client leaving never fails another's request, on the real processes (issue 28).

Streamed `POST /v1/audio/speech` requests run 8 at a time, each client leaving at a random point
(before the answer, right after its headers, after 1, 500, 5,000 or 20,000 bytes, or never); every
request that was not dropped must end with its whole file, and afterwards no stage holds anything
(the stages' request gauges read from their /metrics). The small run is in `make test`; a
1,000-request run is `@pytest.mark.slow`.
"""

from __future__ import annotations

import asyncio
import collections
import os
import random
import re
import urllib.request
from dataclasses import dataclass

import httpx
import pytest

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
    # Room for every client at once (no 429 is a failure of the load, not of the fault under test).
    config = {"max_concurrency": 64}
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
