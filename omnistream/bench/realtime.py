"""Realtime barge-in benchmark: how fast a spoken interruption silences an answer, and that every
stage is idle afterwards.

    python -m omnistream.bench.realtime --model .cache/tiny-model          # starts its own stack
    python -m omnistream.bench.realtime --gateway http://HOST:PORT \\
        --stage-metrics http://HOST:MPORT/metrics ...                      # a running deployment

Each turn: a session with server VAD; a spoken question (espeak-ng, 20 ms pieces at real time);
once the answer's audio flows, `--listen` seconds later, a spoken interruption. Measured on the
client, per turn:

* barge_in_ms: from input_audio_buffer.speech_started to the last output_audio delta received
  (<= 0: no audio came after speech_started);
* cancel_ms: from speech_started to response.done (status must be cancelled);
* idle_ms: from response.done until every stage reports no engine request, open stream or orphan;
* audio_delta_gap_ms: the gaps between audio deltas before the interruption (one talker chunk's
  pace, the "talker step" of the target), and rtt_ms: a WebSocket ping's round trip.

Target: barge_in_ms under one talker step plus one round trip.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import re
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from omnistream.bench.speech import pieces, silence_pcm16, speech_pcm16
from omnistream.bench.stats import _describe

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

IDLE_METRICS = (
    "omnistream_stage_engine_requests",
    "omnistream_stage_open_streams",
    "omnistream_stage_orphaned_requests",
)


@dataclass
class Turn:
    barge_in_ms: float | None = None
    cancel_ms: float | None = None
    idle_ms: float | None = None
    status: str = ""
    gaps_ms: list[float] = field(default_factory=list)
    rtt_ms: float | None = None
    error: str = ""


def _metric_sum(url: str, name: str) -> float:
    body = urllib.request.urlopen(url, timeout=5).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if re.match(rf"^{name}(\{{|\s)", line)
    )


def stages_idle(urls: list[str]) -> bool:
    return all(_metric_sum(url, name) == 0 for url in urls for name in IDLE_METRICS)


async def _speak(ws: ClientConnection, pcm: bytes) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, piece in enumerate(pieces(silence_pcm16(0.2) + pcm + silence_pcm16(0.8))):
        await ws.send(
            json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})
        )
        delay = start + (i + 1) * 0.02 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


async def one_turn(
    url: str, headers: dict[str, str], stage_metrics: list[str], args: argparse.Namespace, seed: int
) -> Turn:
    import websockets

    turn = Turn()
    question = speech_pcm16(args.question)
    interruption = speech_pcm16(args.interruption)
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        session = {
            "type": "realtime",
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}},
            "max_output_tokens": args.max_tokens,
            "omnistream": {"ignore_eos": True, "seed": seed},
        }
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        pong = await ws.ping()
        sent = time.perf_counter()
        await pong
        turn.rtt_ms = (time.perf_counter() - sent) * 1000
        speaker = asyncio.create_task(_speak(ws, question))
        first_audio = last_audio = started = None
        interrupter: asyncio.Task[None] | None = None
        async with asyncio.timeout(args.timeout):
            async for raw in ws:
                now = time.perf_counter()
                event = json.loads(raw)
                kind = event["type"]
                if kind == "response.output_audio.delta":
                    if started is None and last_audio is not None:
                        turn.gaps_ms.append((now - last_audio) * 1000)
                    last_audio = now
                    if first_audio is None:
                        first_audio = now
                elif kind == "input_audio_buffer.speech_started" and interrupter is not None:
                    started = now
                elif kind == "response.done" and first_audio is not None:
                    turn.status = event["response"]["status"]
                    done = now
                    break
                elif kind == "error":
                    turn.error = event["error"]["message"]
                if first_audio is not None and interrupter is None and now - first_audio >= args.listen:
                    await speaker
                    interrupter = asyncio.create_task(_speak(ws, interruption))
        if started is not None and last_audio is not None:
            turn.barge_in_ms = (last_audio - started) * 1000
            turn.cancel_ms = (done - started) * 1000
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while loop.time() < deadline:
            if stages_idle(stage_metrics):
                turn.idle_ms = (time.perf_counter() - done) * 1000
                break
            await asyncio.sleep(0.01)
        for task in (speaker, interrupter):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
    return turn


def summarize(turns: list[Turn]) -> dict[str, Any]:
    return {
        "turns": len(turns),
        "cancelled": sum(t.status == "cancelled" for t in turns),
        "stages_idle_after": sum(t.idle_ms is not None for t in turns),
        "errors": sorted({t.error for t in turns if t.error})[:5],
        "barge_in_ms": _describe([t.barge_in_ms for t in turns if t.barge_in_ms is not None], 1.0),
        "cancel_ms": _describe([t.cancel_ms for t in turns if t.cancel_ms is not None], 1.0),
        "idle_ms": _describe([t.idle_ms for t in turns if t.idle_ms is not None], 1.0),
        "audio_delta_gap_ms": _describe([g for t in turns for g in t.gaps_ms], 1.0),
        "rtt_ms": _describe([t.rtt_ms for t in turns if t.rtt_ms is not None], 1.0),
    }


async def run(args: argparse.Namespace, gateway: str, stage_metrics: list[str]) -> dict[str, Any]:
    url = gateway.replace("http", "ws", 1).rstrip("/") + "/v1/realtime"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    turns = [await one_turn(url, headers, stage_metrics, args, seed) for seed in range(args.turns)]
    return summarize(turns)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", help="start a local stack (thinker, talker, code2wav, gateway) on this checkpoint"
    )
    p.add_argument("--gateway", help="a running gateway's HTTP base URL")
    p.add_argument("--stage-metrics", action="append", default=[], help="a stage's /metrics URL (repeat)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--listen", type=float, default=1.0, help="seconds of answer before interrupting")
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--question", default="Please tell me a very long story about the sea.")
    p.add_argument("--interruption", default="Stop, stop please.")
    p.add_argument("--dtype", default="float32", help="stage dtype for --model")
    args = p.parse_args(argv)
    if bool(args.model) == bool(args.gateway):
        p.error("give --model or --gateway")
    if args.gateway:
        result = asyncio.run(run(args, args.gateway, args.stage_metrics))
    else:
        from omnistream.cli.launcher import start_services

        stages = {
            s: ["serve", s, "--model", args.model, "--dtype", args.dtype]
            for s in ("thinker", "talker", "code2wav")
        }
        services = start_services(stages)
        try:
            gateway_args = ["serve", "gateway", "--http-port", "0", "--grpc-port", "0"]
            for name, service in services.items():
                gateway_args += [f"--{name}", service.address]
            services.update(start_services({"gateway": gateway_args}))
            gw = services["gateway"]
            metrics = [
                f"http://{s.connect_host}:{s.metrics_port}/metrics"
                for n, s in services.items()
                if n != "gateway"
            ]
            result = asyncio.run(run(args, f"http://127.0.0.1:{gw.http_port}", metrics))
        finally:
            for service in services.values():
                service.stop()
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0 if result["cancelled"] == result["turns"] == result["stages_idle_after"] else 1


if __name__ == "__main__":
    sys.exit(main())
