"""`omnistream bench --voice-to-voice`: the time from the end of the user's speech to the first sound
of the answer, measured at a realtime client as a person would feel it (issue 61).

Per cell (mode x utterance seconds x sessions at once), each session speaks `--v2v-turns` turns,
each turn on a fresh /v1/realtime session (a fresh conversation: no history, and every turn's audio
is its own, a +-1 LSB dither seeded by the turn, so no prefix cache serves one turn's audio to the
next; the instructions before it may be cached, as in any deployment). The sessions of a cell start
together. A turn: 0.3 s of silence, speech (espeak-ng: speech.py's `utterance`, the prefix of its
PASSAGE spoken in about the asked length, silent ends trimmed; the rendered length is reported), then
silence, streamed as a microphone would, in 20 ms appends at real time (an append is sent when its
last sample has been "spoken"). The silence before the speech is padded so that the speech ends
exactly at the end of an append; the **end of speech** is the moment the client finished sending
that append (after `ws.send` returned).

* `server_vad`: the session's turn detection is server_vad (`--v2v-window-ms` of silence ends a
  turn, create_response on); the silence after the speech lasts the window + 1.5 s.
* `commit`: no turn detection; right after the end of speech the client sends
  input_audio_buffer.commit and response.create, and streams nothing more.

`--v2v-interleave` runs the lengths of one mode and session count together, taking turns (A B, then
B A), so that what a length costs more than another is not the machine's drift between cells run
one after another (a cell's turns then share the group's speculation counts).

`--v2v-gap-ms` N puts N ms of silence in the middle of each utterance: a pause the speaker goes on
after. With server_vad a pause longer than the window less the gateway's speculation lead
(gateway/realtime/speculation.py) starts an answer that the speech after it cancels: each turn
then wastes a speculation, which must cost no other session a stall.

Per turn, at the client: **v2v_ms** = the first non-empty response.output_audio.delta's arrival -
the end of speech; for server_vad also **detector_ms** = input_audio_buffer.speech_stopped's arrival
- the end of speech, **after_detector_ms** = v2v_ms - detector_ms, **detector_end_ms** = where the
detector placed the end (its `audio_end_ms`) - where the speech ended in the stream; and
**first_chunk_ms**, the audio the planner made the answer wait for (response.done's). Answers are
short: audio and text, greedy, 16 tokens (ignore EOS), at most 24 codec frames. Per cell also
**continuity**: the share of answers whose audio, as the gateway handed it out, never fell more than
100 ms behind a player (`continuity_ok`), and the gateway's speculations by outcome over the cell
(`omnistream_realtime_speculations_total`). One warm-up turn (commit, shortest utterance) runs first.

Writes voice_to_voice.json (every turn) and voice_to_voice.md (median and p90 per cell) to
`--output-dir`. Starts its own stack on `--model` (`omnistream up`'s start_stack) unless
`--gateway` gives a running gateway's HTTP URL (API key: $OMNISTREAM_API_KEY).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnistream.bench.speech import RATE, Utterance, dithered, pieces, silence_pcm16, utterance
from omnistream.bench.voice_to_voice_report import Cell, Turn, summarize, table

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

MODES = ("server_vad", "commit")
PIECE_MS = 20
LEAD_S = 0.3  # silence before the speech (at least; padded to end the speech on a piece boundary)
AFTER_WINDOW_S = 1.5  # server_vad: the silence after the speech is the window + this
MAX_TOKENS, AUDIO_FRAMES = 16, 24
TURN_TIMEOUT_S = 120.0
INSTRUCTIONS = "You are a helpful voice assistant. Keep your answers short."


def layout(speech: bytes, trailing_s: float, gap_ms: int = 0) -> tuple[bytes, int]:
    """The stream of a turn: silence (>= LEAD_S, padded so the speech ends on a piece boundary),
    the speech (with `gap_ms` of silence in its middle), `trailing_s` of silence; and the index of
    the piece holding the speech's end."""
    if gap_ms:
        middle = len(speech) // 4 * 2
        speech = speech[:middle] + silence_pcm16(gap_ms / 1000) + speech[middle:]
    piece = RATE * PIECE_MS // 1000 * 2
    lead = len(silence_pcm16(LEAD_S))
    lead += (-(lead + len(speech))) % piece
    stream = bytes(lead) + speech + silence_pcm16(trailing_s)
    return stream, (lead + len(speech)) // piece - 1


def session_config(mode: str, window_ms: int, seed: int) -> dict[str, Any]:
    detection = (
        {"type": "server_vad", "silence_duration_ms": window_ms, "create_response": True}
        if mode == "server_vad"
        else None
    )
    return {
        "type": "realtime",
        "instructions": INSTRUCTIONS,
        "output_modalities": ["audio", "text"],
        "audio": {"input": {"turn_detection": detection}},
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "omnistream": {"ignore_eos": True, "seed": seed, "max_audio_frames": AUDIO_FRAMES},
    }


def _append(piece: bytes) -> str:
    return json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(piece).decode()})


async def _speak(ws: ClientConnection, stream: bytes, last: int, commit: bool) -> float:
    """Stream `stream` at real time, each piece once it is all "spoken"; the perf_counter time
    the piece `last` (the end of speech) was sent. `commit`: commit and ask for the answer then,
    and stop there."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    end = 0.0
    for i, piece in enumerate(pieces(stream, PIECE_MS)):
        delay = start + (i + 1) * PIECE_MS / 1000 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        await ws.send(_append(piece))
        if i == last:
            end = time.perf_counter()
            if commit:
                await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
                await ws.send(json.dumps({"type": "response.create"}))
                break
    return end


async def _listen(ws: ClientConnection, turn: Turn) -> dict[str, float]:
    """Server events until response.done: the arrival times of the first audio delta and of
    speech_stopped (and its audio_end_ms)."""
    seen: dict[str, float] = {}
    async for raw in ws:
        now = time.perf_counter()
        event = json.loads(raw)
        kind = event["type"]
        if kind == "response.output_audio.delta" and event.get("delta") and "audio" not in seen:
            seen["audio"] = now
        elif kind == "input_audio_buffer.speech_stopped" and "stopped" not in seen:
            seen["stopped"], seen["audio_end_ms"] = now, float(event.get("audio_end_ms", 0))
        elif kind == "error" and not turn.error:
            turn.error = str(event["error"].get("message", "error"))[:200]
        elif kind == "response.done":
            turn.status = event["response"].get("status", "")
            omni = event["response"].get("omnistream") or {}
            turn.continuity_ok, turn.first_chunk_ms = omni.get("continuity_ok"), omni.get("first_chunk_ms")
            return seen
    raise ConnectionError("the session closed before response.done")


async def one_turn(
    url: str, mode: str, speech: Utterance, window_ms: int, turn: Turn, seed: int, gap_ms: int = 0
) -> Turn:
    import websockets

    key = os.environ.get("OMNISTREAM_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    trailing = window_ms / 1000 + AFTER_WINDOW_S if mode == "server_vad" else 0.0
    stream, last = layout(dithered(speech.pcm, seed), trailing, gap_ms)
    try:
        async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
            await ws.send(
                json.dumps({"type": "session.update", "session": session_config(mode, window_ms, seed)})
            )
            async with asyncio.timeout(TURN_TIMEOUT_S):
                async for raw in ws:
                    if json.loads(raw)["type"] in ("session.updated", "error"):
                        break
                speaking = asyncio.create_task(_speak(ws, stream, last, mode == "commit"))
                try:
                    seen = await _listen(ws, turn)
                    end = await speaking
                finally:
                    speaking.cancel()
    except Exception as exc:  # a refused or closed connection, a timeout: the turn failed
        turn.error = turn.error or f"{type(exc).__name__}: {exc}"[:200]
        return turn
    speech_end_ms = (len(stream) - len(silence_pcm16(trailing))) / 2 / RATE * 1000
    if "audio" in seen:
        turn.v2v_ms = (seen["audio"] - end) * 1000
    elif not turn.error:
        turn.error = f"no audio (response {turn.status})"
    if "stopped" in seen:
        turn.detector_ms = (seen["stopped"] - end) * 1000
        turn.detector_end_ms = seen["audio_end_ms"] - speech_end_ms
        if turn.v2v_ms is not None:
            turn.after_detector_ms = turn.v2v_ms - turn.detector_ms
    return turn


def cells(args: argparse.Namespace) -> list[Cell]:
    """The flags' cells, in run order (mode, then utterance length, then sessions)."""
    modes = [m.strip() for m in args.v2v_modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise ValueError(f"--v2v-modes takes a comma list of {', '.join(MODES)}, got {args.v2v_modes!r}")
    seconds = [float(s) for s in args.v2v_seconds.split(",") if s.strip()]
    sessions = [int(s) for s in args.v2v_sessions.split(",") if s.strip()]
    if not seconds or not sessions or min(seconds) <= 0 or min(sessions) < 1 or args.v2v_turns < 1:
        raise ValueError("--v2v-seconds, --v2v-sessions and --v2v-turns must be positive")
    return [Cell(m, s, n) for m in modes for s in seconds for n in sessions]


def groups(plan: list[Cell], interleave: bool) -> list[list[Cell]]:
    """The cells that run together: each alone, or (`--v2v-interleave`) those of one mode and
    session count, whose utterance lengths then take turns."""
    if not interleave:
        return [[cell] for cell in plan]
    together: dict[tuple[str, int], list[Cell]] = {}
    for cell in plan:
        together.setdefault((cell.mode, cell.sessions), []).append(cell)
    return list(together.values())


async def run_group(
    url: str, group: list[Cell], speech: dict[float, Utterance], args: argparse.Namespace, seed: int
) -> list[list[Turn]]:
    """`sessions` clients at once, each `--v2v-turns` rounds one after another; a round is one turn
    of each cell's length, in the group's order and reversed the next round (A B, B A: each length
    meets the machine as the others do, where cells run one after another meet it in turn). Each
    cell's turns."""

    async def client(k: int) -> list[list[Turn]]:
        done: list[list[Turn]] = [[] for _ in group]
        for t in range(args.v2v_turns):
            order = range(len(group)) if t % 2 == 0 else reversed(range(len(group)))
            for i in order:
                cell = group[i]
                turn = Turn(cell.mode, k, t, speech[cell.seconds].seconds)
                turn_seed = seed + (k * args.v2v_turns + t) * len(group) + i
                utter = speech[cell.seconds]
                done[i].append(
                    await one_turn(
                        url, cell.mode, utter, args.v2v_window_ms, turn, turn_seed, args.v2v_gap_ms
                    )
                )
        return done

    per_session = await asyncio.gather(*(client(k) for k in range(group[0].sessions)))
    return [[t for session in per_session for t in session[i]] for i in range(len(group))]


async def measure(
    url: str, args: argparse.Namespace, plan: list[Cell], speech: dict[float, Utterance]
) -> list[dict[str, Any]]:
    """A warm-up turn, then every cell (`speech`: the utterance of each length asked for)."""
    shortest = speech[min(speech)]
    warm = await one_turn(url, "commit", shortest, args.v2v_window_ms, Turn("commit", 0, 0, 0.0), 10**6)
    if warm.error:
        print(f"voice-to-voice bench: warm-up turn: {warm.error}", file=sys.stderr)
    rows, seed = [], args.seed * 10**7
    for group in groups(plan, args.v2v_interleave):
        lengths = ", ".join(f"{speech[c.seconds].seconds:.2f}" for c in group)
        label = f"{group[0].mode}, {lengths} s of speech, {group[0].sessions} at once"
        print(f"voice-to-voice bench: {label}", file=sys.stderr)
        before = await asyncio.to_thread(speculations_at, url)
        cells_turns = await run_group(url, group, speech, args, seed)
        after = await asyncio.to_thread(speculations_at, url)
        seed += group[0].sessions * args.v2v_turns * len(group)
        grew = None
        if before is not None and after is not None:
            grew = {k: v - before.get(k, 0.0) for k, v in after.items()}
        for cell, turns in zip(group, cells_turns, strict=True):
            row = summarize(cell, speech[cell.seconds], args.v2v_window_ms, turns, grew)
            row["interleaved"] = len(group) > 1  # its speculations are then the group's
            rows.append(row)
    return rows


def speculations_at(url: str) -> dict[str, float] | None:
    """The gateway's speculations so far by outcome (its /metrics, next to `url`'s /v1/realtime);
    None when it cannot be read (an API key on /metrics, an older gateway)."""
    import re
    import urllib.request

    metrics = url.replace("ws", "http", 1).removesuffix("/v1/realtime") + "/metrics"
    try:
        body = urllib.request.urlopen(metrics, timeout=5).read().decode()
    except OSError:
        return None
    pattern = r'^omnistream_realtime_speculations_total\{outcome="(\w+)"\} (\S+)$'
    return {k: float(v) for k, v in re.findall(pattern, body, re.M)}


def _gateway_url(given: str) -> str:
    base = given if "://" in given else f"http://{given}"
    return base.replace("http", "ws", 1).rstrip("/") + "/v1/realtime"


async def _on_own_stack(
    args: argparse.Namespace, plan: list[Cell], speech: dict[float, Utterance]
) -> list[dict[str, Any]]:
    """`omnistream up`'s stack on --model (with --gateway-args, --prefill-chunk, --thinker-nice)."""
    import shlex

    from omnistream.bench.cells import audio_holds
    from omnistream.cli.launcher import ServiceProcess
    from omnistream.cli.up import start_stack, stop_stack

    extra: dict[str, Any] = {}
    if args.prefill_chunk is not None:
        extra["prefill_chunk"] = args.prefill_chunk
    if args.thinker_nice is not None:
        extra["thinker_nice"] = args.thinker_nice
    services: dict[str, ServiceProcess] = {}
    try:
        gateway = await asyncio.to_thread(
            start_stack,
            args.model,
            services,
            audio_hold=audio_holds(args.audio_hold)[0],
            gateway_flags=shlex.split(args.gateway_args),
            **extra,
        )
        return await measure(_gateway_url(f"127.0.0.1:{gateway.http_port}"), args, plan, speech)
    finally:
        await asyncio.to_thread(stop_stack, services)


async def run_voice_to_voice(args: argparse.Namespace) -> int:
    from omnistream.bench import report
    from omnistream.bench.machine import machine_info

    try:
        plan = cells(args)
        speech = {s: utterance(s) for s in dict.fromkeys(c.seconds for c in plan)}
    except ValueError as exc:
        print(f"omnistream bench: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    machine = machine_info()
    if args.gateway:
        rows = await measure(_gateway_url(args.gateway), args, plan, speech)
    else:
        rows = await _on_own_stack(args, plan, speech)
    text = table(rows)
    payload = {
        "machine": machine,
        "args": {k: (v if v != float("inf") else "inf") for k, v in vars(args).items() if k != "func"},
        "wall_seconds": time.perf_counter() - t0,
        "load_after": os.getloadavg(),
        "cells": rows,
    }
    report.write_json(out_dir / "voice_to_voice.json", payload)
    (out_dir / "voice_to_voice.md").write_text(text)
    print(text)
    print(f"wrote voice_to_voice.json, voice_to_voice.md to {out_dir}")
    return 1 if any(r["failed"] for r in rows) else 0
