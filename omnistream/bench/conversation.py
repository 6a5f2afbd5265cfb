"""`omnistream bench --conversation`: conversation memory (issue 37), the prefix cache on against off.

Per checkpoint (`--conversation-models`: tiny, real-shaped, or a checkpoint directory) and per cache
setting (on: the stages' default prefix cache; off: `--prefix-cache-gib 0`), run A B B A over
`--repeats` (on, off, off, on), each run on a fresh stack (`omnistream up`'s start_stack: every run
starts with an empty cache and nothing of the run before it), the same three workloads:

- realtime: one /v1/realtime session of `--conversation-turns` spoken turns. Each turn is a sentence
  spoken by espeak-ng (2.9-4.3 s, omnistream/bench/speech.py); with `--conversation-turn-seconds`
  (e.g. 4.5) it ends in silence up to that length, as a turn that voice activity detection commits
  ends in the silence that closed it: every turn then brings the same new audio (65 audio tokens
  at 4.5 s), and turn N against turn 2 differs only in the history. Sent as a
  `conversation.item.create` with an `input_audio` part; once the item is in the conversation,
  `response.create`. Per turn, timed at the client from response.create: TTFT (the first transcript
  or text delta), TTFP (the first audio delta), and `response.done`'s usage: input_tokens and
  input_token_details.cached_tokens, and the gateway's own TTFT (`response.omnistream.ttft_ms`, from
  the response's start there: the rest of the client's TTFT is the websocket and the turn's set-up).
- rest: a chat of as many turns over POST /v1/chat/completions (streamed, pcm16 audio, usage in
  the last chunk), each turn re-sending the whole history (system, then user and assistant turns:
  the assistant turn is the transcript the turn before streamed); the user turns are the same
  sentences, as text. Per turn: TTFT, TTFP from the request, usage.prompt_tokens and
  usage.prompt_tokens_details.cached_tokens.
- concurrent: `--conversation-concurrency` REST conversations at once (each its own words, so they
  share only the system prompt), `--conversation-concurrent-turns` turns each: audio seconds, output
  tokens and turns per second of wall time, and the TTFT of all their turns.

Answers are short and alike on both sides: greedy text and voice, `--conversation-max-tokens`
tokens (ignore EOS) and at most `--conversation-audio-frames` codec frames a turn. A warm-up
(a REST request and a one-turn realtime session with other words) runs on each fresh stack first.

Targets (issue 37), with the cache: turn N's TTFT at most 1.25x turn 2's on the tiny checkpoint and
1.5x on the real-shaped one (and on any other), at turn N at least 80% of the input tokens cached,
and at concurrency 10 no less throughput (audio s/s) than without the cache, to within
`--conversation-throughput-tolerance`. Each target is printed with pass/fail; the runs' numbers go to
`conversation.json` and the tables to `conversation.md` under `--output-dir`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnistream.bench.stats import RequestResult

if TYPE_CHECKING:
    from omnistream.bench.clients import RestGatewayClient
    from omnistream.request.defaults import RequestInput

Row = dict[str, Any]  # a JSON object of the results: a turn, a merged turn, a concurrency run

# Spoken user turns (espeak-ng takes 3-5 s for each), and the REST chat's turns as text.
SENTENCES = (
    "Hello there, could you tell me what the weather is like today?",
    "I am planning a small trip to the mountains next weekend with friends.",
    "What should I pack if the nights are going to be quite cold?",
    "We will probably drive, and the road takes about four hours each way.",
    "Do you know any good games to play in the car on the way?",
    "One of my friends is vegetarian, so we need to plan the meals carefully.",
    "Could you suggest a simple dinner we can cook over a camp fire?",
    "I also want to take some photos of the stars at night.",
    "What settings would you use on a camera for pictures of the night sky?",
    "My phone battery always runs out quickly when it is cold outside.",
    "Is it better to keep the phone in a pocket or in the backpack?",
    "We might see some deer or even a fox near the lake in the morning.",
    "How far away should we stay from wild animals to be safe?",
    "On Sunday we would like to hike to the top of the nearest peak.",
    "How much water should each person carry for a six hour hike?",
    "If it starts raining, we will have to change our plans for the day.",
    "What could we do indoors in a small mountain village when it rains?",
    "I would like to bring back a small gift for my grandmother.",
    "She likes honey and wool, and she collects little wooden birds.",
    "Thank you, that was helpful, please summarize the plan in one sentence.",
)
SYSTEM = "You are a helpful voice assistant. Keep your answers short."
SHOWN_TURNS = (1, 2, 5, 10, 15, 20)
WORKLOADS = ("realtime", "rest", "concurrent")
TURN_TIMEOUT_S = 300.0
# Targets: turn N's TTFT over turn 2's, with the cache, per checkpoint label (others: OTHER_GROWTH).
TTFT_GROWTH = {"tiny": 1.25, "real-shaped": 1.5}
OTHER_GROWTH = 1.5
MIN_CACHED_SHARE = 0.80
REAL_SHAPED_DIR = Path(".cache") / "real-shaped-model"


@dataclass
class Turn:
    """One turn of a conversation as the client saw it (times in ms from the turn's request)."""

    turn: int
    ttft_ms: float | None = None
    ttfp_ms: float | None = None
    e2e_ms: float | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    audio_seconds: float = 0.0
    error: str = ""
    gateway_ttft_ms: float | None = None  # realtime: as the gateway measured it (response.omnistream)

    @property
    def cached_share(self) -> float | None:
        if self.input_tokens is None or self.cached_tokens is None or not self.input_tokens:
            return None
        return self.cached_tokens / self.input_tokens

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"cached_share": self.cached_share}


def _ms(start: float, at: float | None) -> float | None:
    return None if at is None else 1000.0 * (at - start)


def turn_from_result(turn: int, result: RequestResult) -> Turn:
    """A REST turn's numbers from the client's record of its stream."""
    return Turn(
        turn=turn,
        ttft_ms=None if result.ttft is None else 1000.0 * result.ttft,
        ttfp_ms=None if result.ttfp is None else 1000.0 * result.ttfp,
        e2e_ms=1000.0 * result.e2e,
        input_tokens=result.prompt_tokens,
        cached_tokens=result.cached_tokens,
        output_tokens=result.tokens,
        audio_seconds=result.audio_seconds,
        error="" if result.ok else (result.error or "failed"),
    )


def user_text(turn: int, offset: int = 0) -> str:
    """Turn `turn`'s (1-based) user sentence; `offset` rotates them for another conversation."""
    return SENTENCES[(turn - 1 + offset) % len(SENTENCES)]


# --- aggregation, tables, targets (pure) ----------------------------------------------------------
def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def merge_turns(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """Per turn over repeated runs of one setting: the median of each number (the runs' values are
    kept as `<key>_runs`); a turn that failed in a run counts in `errors`, not in the medians."""
    count = max((len(r) for r in runs), default=0)
    merged = []
    for i in range(count):
        rows = [r[i] for r in runs if i < len(r)]
        good = [row for row in rows if not row.get("error")]
        out: dict[str, Any] = {"turn": i + 1, "runs": len(rows), "errors": len(rows) - len(good)}
        for key in (
            "ttft_ms",
            "ttfp_ms",
            "e2e_ms",
            "gateway_ttft_ms",
            "input_tokens",
            "cached_tokens",
            "cached_share",
        ):
            values = [row.get(key) for row in good]
            out[key] = _median(values)
            out[f"{key}_runs"] = values
        merged.append(out)
    return merged


def merge_concurrent(runs: Sequence[Row]) -> Row:
    """Repeated concurrency runs of one setting: the median of each throughput and of the mean
    TTFT (a run that a burst of the shared machine's other load slowed counts as one run, not as
    its share of a mean)."""
    out: dict[str, Any] = {"runs": len(runs)}
    for key in ("audio_throughput", "output_token_throughput", "turn_throughput", "ttft_ms_mean"):
        values = [r[key] for r in runs if r.get(key) is not None]
        out[key] = _median(values)
        out[f"{key}_runs"] = values
    out["turns"] = sum(r.get("turns", 0) for r in runs)
    out["failed"] = sum(r.get("failed", 0) for r in runs)
    return out


def _turn(rows: Sequence[Row], number: int) -> Row | None:
    return next((row for row in rows if row["turn"] == number), None)


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def growth(rows: Sequence[Row], last: int | None = None, first: int = 2) -> float | None:
    """Turn `last`'s TTFT (default: the last turn) over turn `first`'s."""
    if not rows:
        return None
    a, b = _turn(rows, last or rows[-1]["turn"]), _turn(rows, first)
    return ratio(a["ttft_ms"] if a else None, b["ttft_ms"] if b else None)


def window_growth(rows: Sequence[Row], width: int = 3) -> float | None:
    """The median TTFT of the last `width` turns over that of turns 2 .. 1 + width: the same
    comparison as `growth`, less at the mercy of one slow turn on a shared machine (not a target)."""
    if len(rows) < 1 + 2 * width:
        return None
    early = _median([r["ttft_ms"] for r in rows if 2 <= r["turn"] <= 1 + width])
    late = _median([r["ttft_ms"] for r in rows[-width:]])
    return ratio(late, early)


def ratios(summary: dict[str, Row]) -> dict[str, float | None]:
    """Every checkpoint's comparisons, by name (conversation.json's `ratios`)."""
    out: dict[str, float | None] = {}
    for label, settings in summary.items():
        on, off = settings.get("on", {}), settings.get("off", {})
        for workload in ("realtime", "rest"):
            for cache, merged in (("on", on), ("off", off)):
                rows = merged.get(workload)
                if not rows:
                    continue
                last = rows[-1]["turn"]
                out[f"{label} {workload} cache {cache}: TTFT turn {last} / turn 2"] = growth(rows)
                out[f"{label} {workload} cache {cache}: TTFT last 3 turns / turns 2-4"] = window_growth(rows)
                out[f"{label} {workload} cache {cache}: cached share at turn {last}"] = rows[-1][
                    "cached_share"
                ]
        if on.get("concurrent") and off.get("concurrent"):
            for key, name in (("audio_throughput", "audio s/s"), ("output_token_throughput", "tok/s")):
                out[f"{label} concurrent: {name} cache on / off"] = ratio(
                    on["concurrent"][key], off["concurrent"][key]
                )
    return out


@dataclass(frozen=True)
class Target:
    name: str
    checkpoint: str
    value: float | None
    limit: float
    at_most: bool  # value <= limit passes (else value >= limit)

    @property
    def passed(self) -> bool:
        if self.value is None:
            return False
        return self.value <= self.limit if self.at_most else self.value >= self.limit

    def line(self) -> str:
        shown = "n/a" if self.value is None else f"{self.value:.3f}"
        sign = "<=" if self.at_most else ">="
        verdict = "PASS" if self.passed else "FAIL"
        return f"{verdict}  [{self.checkpoint}] {self.name}: {shown} ({sign} {self.limit:g})"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"passed": self.passed}


def growth_limit(label: str) -> float:
    return TTFT_GROWTH.get(label, OTHER_GROWTH)


def check_targets(summary: dict[str, Row], tolerance: float = 0.05) -> list[Target]:
    """The issue's targets for each checkpoint's summary ({"on": ..., "off": ...}, each with the
    workloads it ran: per-turn rows for realtime and rest, a merged concurrency run)."""
    targets = []
    for label, settings in summary.items():
        on, off = settings.get("on", {}), settings.get("off", {})
        for workload in ("realtime", "rest"):
            rows = on.get(workload)
            if not rows:
                continue
            last = rows[-1]["turn"]
            targets.append(
                Target(
                    f"{workload}: TTFT turn {last} / turn 2, cache on",
                    label,
                    growth(rows),
                    growth_limit(label),
                    True,
                )
            )
            targets.append(
                Target(
                    f"{workload}: cached share of the input at turn {last}, cache on",
                    label,
                    rows[-1]["cached_share"],
                    MIN_CACHED_SHARE,
                    False,
                )
            )
        if on.get("concurrent") and off.get("concurrent"):
            conc = on["concurrent"].get("concurrency", "N")
            targets.append(
                Target(
                    f"concurrent (c{conc}): audio s/s cache on / off (tolerance {tolerance:g})",
                    label,
                    ratio(on["concurrent"]["audio_throughput"], off["concurrent"]["audio_throughput"]),
                    1.0 - tolerance,
                    False,
                )
            )
    return targets


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if value is None else fmt.format(value)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def turn_table(on: Sequence[Row], off: Sequence[Row], shown: Sequence[int] = SHOWN_TURNS) -> str:
    """Markdown: the chosen turns (and the last), cache on beside cache off."""
    count = max([r["turn"] for r in [*on, *off]], default=0)
    turns = sorted({t for t in shown if t <= count} | ({count} if count else set()))
    gateway = any(r.get("gateway_ttft_ms") is not None for r in on)  # realtime: the gateway's own TTFT
    lines = [
        "| turn | TTFT on ms | TTFT off ms | TTFP on ms | TTFP off ms | input tokens | cached on | "
        "cached share on | cached off |" + (" gateway TTFT on ms |" if gateway else ""),
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if gateway else ""),
    ]
    for t in turns:
        a, b = _turn(on, t) or {}, _turn(off, t) or {}
        lines.append(
            f"| {t} | {_num(a.get('ttft_ms'))} | {_num(b.get('ttft_ms'))} | {_num(a.get('ttfp_ms'))} | "
            f"{_num(b.get('ttfp_ms'))} | {_num(a.get('input_tokens') or b.get('input_tokens'), '{:.0f}')} | "
            f"{_num(a.get('cached_tokens'), '{:.0f}')} | {_pct(a.get('cached_share'))} | "
            f"{_num(b.get('cached_tokens'), '{:.0f}')} |"
            + (f" {_num(a.get('gateway_ttft_ms'))} |" if gateway else "")
        )
    return "\n".join(lines)


def concurrent_table(on: Row | None, off: Row | None) -> str:
    lines = [
        "| cache | conversations x turns | failed | audio s/s | output tok/s | turns/s | TTFT mean ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in (("on", on), ("off", off)):
        if not row:
            continue
        runs = ", ".join(f"{v:.2f}" for v in row["audio_throughput_runs"])
        lines.append(
            f"| {name} | {row.get('concurrency', '?')} x {row.get('turns_each', '?')} | {row['failed']} | "
            f"{_num(row['audio_throughput'], '{:.2f}')} ({runs}) | "
            f"{_num(row['output_token_throughput'])} | {_num(row['turn_throughput'], '{:.2f}')} | "
            f"{_num(row['ttft_ms_mean'])} |"
        )
    return "\n".join(lines)


def report(summary: dict[str, Row], targets: Sequence[Target]) -> str:
    """The markdown report: per checkpoint and workload the per-turn table and its ratios, the
    concurrency table, then every target with pass/fail."""
    parts = []
    for label, settings in summary.items():
        on, off = settings.get("on", {}), settings.get("off", {})
        for workload in ("realtime", "rest"):
            if not (on.get(workload) or off.get(workload)):
                continue
            a, b = on.get(workload) or [], off.get(workload) or []
            last = max(r["turn"] for r in [*a, *b])
            parts.append(f"### {label}: {workload}, {last} turns (median of the runs per turn)\n")
            parts.append(turn_table(a, b))
            parts.append(
                f"\nTTFT turn {last} / turn 2: cache on {_num(growth(a), '{:.2f}')}x, "
                f"off {_num(growth(b), '{:.2f}')}x (last 3 turns / turns 2-4: on "
                f"{_num(window_growth(a), '{:.2f}')}x, off {_num(window_growth(b), '{:.2f}')}x); "
                f"cached share at turn {last}: on {_pct(a[-1]['cached_share'] if a else None)}, "
                f"off {_pct(b[-1]['cached_share'] if b else None)}\n"
            )
        if on.get("concurrent") or off.get("concurrent"):
            parts.append(
                f"### {label}: concurrent REST conversations (median of the runs; each run's audio s/s "
                "in brackets, in run order)\n"
            )
            parts.append(concurrent_table(on.get("concurrent"), off.get("concurrent")))
            parts.append("")
    parts.append("### Targets\n")
    parts.extend(f"- {t.line()}" for t in targets)
    return "\n".join(parts) + "\n"


def plan(repeats: int) -> list[str]:
    """The cache settings in run order: on, off, off, on, ... (A B B A)."""
    from omnistream.bench.cells import interleave

    return list(interleave(["on", "off"], repeats))


def summarize_runs(runs: Sequence[Row]) -> dict[str, Row]:
    """{"on": {...}, "off": {...}} of one checkpoint's runs, each workload merged over its runs."""
    out: dict[str, Row] = {}
    for setting in ("on", "off"):
        mine = [r for r in runs if r["cache"] == setting]
        if not mine:
            continue
        merged: dict[str, Any] = {}
        for workload in ("realtime", "rest"):
            turn_runs = [r[workload] for r in mine if r.get(workload) is not None]
            if turn_runs:
                merged[workload] = merge_turns(turn_runs)
        concurrent = [r["concurrent"] for r in mine if r.get("concurrent") is not None]
        if concurrent:
            merged["concurrent"] = merge_concurrent(concurrent) | {
                "concurrency": concurrent[0].get("concurrency"),
                "turns_each": concurrent[0].get("turns_each"),
            }
        out[setting] = merged
    return out


# --- the workloads ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Answer:
    """How long each turn's answer is: greedy, exactly `max_tokens` tokens, at most `audio_frames`."""

    max_tokens: int = 16
    audio_frames: int = 24
    seed: int = 0

    def rest_input(self, messages: list[Row]) -> RequestInput:
        from omnistream.request.defaults import RequestInput

        return RequestInput(
            messages=messages,
            max_tokens=self.max_tokens,
            ignore_eos=True,
            temperature=0.0,
            seed=self.seed,
            max_audio_frames=self.audio_frames,
            talker_temperature=0.0,
            talker_repetition_penalty=1.0,
        )


async def rest_conversation(
    client: RestGatewayClient, turns: int, answer: Answer, offset: int = 0, out: list[Turn] | None = None
) -> list[Turn]:
    """One REST chat of `turns` turns, each re-sending the whole history. `client`: a
    RestGatewayClient; `out`: where the turns go as they end (also those before a failure)."""
    history: list[Row] = [{"role": "system", "content": SYSTEM}]
    out = [] if out is None else out
    for turn in range(1, turns + 1):
        history.append({"role": "user", "content": user_text(turn, offset)})
        result = await client.chat(answer.rest_input(list(history)))
        out.append(turn_from_result(turn, result))
        # A failed turn's answer is whatever arrived: the conversation goes on as a client's would.
        history.append({"role": "assistant", "content": result.text or "..."})
    return out


async def concurrent_rest(
    client: RestGatewayClient, conversations: int, turns: int, answer: Answer
) -> tuple[Row, list[list[Turn]]]:
    """`conversations` REST chats at once, each with its own words (a conversation's number opens
    its first turn, so they share only the system prompt): throughput over all their turns."""
    results: list[list[RequestResult]] = [[] for _ in range(conversations)]

    async def one(k: int) -> list[Turn]:
        history: list[Row] = [{"role": "system", "content": SYSTEM}]
        out = []
        for turn in range(1, turns + 1):
            text = user_text(turn, 3 * k)
            history.append({"role": "user", "content": f"Caller {k + 1}. {text}" if turn == 1 else text})
            result = await client.chat(answer.rest_input(list(history)))
            results[k].append(result)
            out.append(turn_from_result(turn, result))
            history.append({"role": "assistant", "content": result.text or "..."})
        return out

    started = time.perf_counter()
    per_conversation = await asyncio.gather(*(one(k) for k in range(conversations)))
    wall = time.perf_counter() - started
    done = [r for rs in results for r in rs]
    ok = [r for r in done if r.ok]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    summary = {
        "concurrency": conversations,
        "turns_each": turns,
        "turns": len(done),
        "failed": len(done) - len(ok),
        "errors": sorted({r.error for r in done if not r.ok})[:5],
        "wall_s": wall,
        "audio_seconds": sum(r.audio_seconds for r in ok),
        "output_tokens": sum(r.tokens for r in ok),
        "audio_throughput": sum(r.audio_seconds for r in ok) / wall,
        "output_token_throughput": sum(r.tokens for r in ok) / wall,
        "turn_throughput": len(ok) / wall,
        "ttft_ms_mean": 1000.0 * statistics.mean(ttfts) if ttfts else None,
    }
    return summary, list(per_conversation)


async def _events_until(ws: Any, done: Callable[[Row], bool], timeout: float) -> list[tuple[float, Row]]:
    """Server events (with their arrival times) up to and including the first for which `done`."""
    seen = []
    async with asyncio.timeout(timeout):
        async for raw in ws:
            event = json.loads(raw)
            seen.append((time.perf_counter(), event))
            if done(event):
                return seen
    raise ConnectionError("the session closed")


def realtime_turn_from_events(turn: int, start: float, events: list[tuple[float, Row]], rate: int) -> Turn:
    """A realtime turn's numbers from the events after its response.create (sent at `start`)."""
    out = Turn(turn=turn)
    for at, event in events:
        kind = event["type"]
        if kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            if out.ttft_ms is None and event.get("delta"):
                out.ttft_ms = _ms(start, at)
        elif kind == "response.output_audio.delta":
            samples = len(base64.b64decode(event.get("delta") or "")) // 2
            if samples and out.ttfp_ms is None:
                out.ttfp_ms = _ms(start, at)
            out.audio_seconds += samples / rate
        elif kind == "error" and not out.error:
            out.error = event["error"].get("message", "error")[:200]
        elif kind == "response.done":
            out.e2e_ms = _ms(start, at)
            response = event["response"]
            out.gateway_ttft_ms = (response.get("omnistream") or {}).get("ttft_ms")
            usage = response.get("usage") or {}
            out.input_tokens = usage.get("input_tokens")
            out.cached_tokens = (usage.get("input_token_details") or {}).get("cached_tokens")
            out.output_tokens = usage.get("output_tokens")
            status, details = response.get("status"), response.get("status_details") or {}
            # ignore EOS: every answer runs to max_output_tokens, which the API calls incomplete
            finished = status == "completed" or (
                status == "incomplete" and details.get("reason") == "max_output_tokens"
            )
            if not finished and not out.error:
                out.error = f"response {response.get('status')}: {response.get('status_details')}"[:200]
    return out


async def realtime_conversation(
    base_url: str,
    turns: int,
    answer: Answer,
    offset: int = 0,
    rate: int = 24000,
    out: list[Turn] | None = None,
    turn_seconds: float = 0.0,
) -> list[Turn]:
    """One realtime session of `turns` spoken turns (no turn detection: each turn an input_audio
    item, then response.create once the item is in the conversation); `out`: where the turns go
    as they end (also those before a failure); `turn_seconds`: each turn's speech ends in silence
    up to this length (a longer sentence is sent whole)."""
    import websockets

    from omnistream.bench.speech import speech_pcm16, until

    url = base_url.replace("http", "ws", 1).rstrip("/") + "/v1/realtime"
    session = {
        "type": "realtime",
        "output_modalities": ["audio"],
        "instructions": SYSTEM,
        "audio": {"input": {"turn_detection": None}},
        "max_output_tokens": answer.max_tokens,
        "temperature": 0.0,
        "omnistream": {"ignore_eos": True, "seed": answer.seed, "max_audio_frames": answer.audio_frames},
    }
    out = [] if out is None else out
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.update", "session": session}))
        await _events_until(ws, lambda e: e["type"] in ("session.updated", "error"), TURN_TIMEOUT_S)
        for turn in range(1, turns + 1):
            pcm = until(speech_pcm16(user_text(turn, offset)), turn_seconds)
            item_id = f"user-{turn}"
            item = {
                "id": item_id,
                "type": "message",
                "role": "user",
                "content": [{"type": "input_audio", "audio": base64.b64encode(pcm).decode()}],
            }
            await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))

            def added_or_refused(event: Row, item_id: str = item_id) -> bool:
                done = event["type"] == "conversation.item.done" and event["item"].get("id") == item_id
                return bool(done or event["type"] == "error")

            added = await _events_until(ws, added_or_refused, TURN_TIMEOUT_S)
            if added[-1][1]["type"] == "error":
                out.append(Turn(turn=turn, error=added[-1][1]["error"].get("message", "error")[:200]))
                continue
            start = time.perf_counter()
            await ws.send(json.dumps({"type": "response.create"}))
            try:
                events = await _events_until(ws, lambda e: e["type"] == "response.done", TURN_TIMEOUT_S)
            except TimeoutError:
                out.append(Turn(turn=turn, error="no response.done"))
                break
            out.append(realtime_turn_from_events(turn, start, events, rate))
    return out


# --- the runs -----------------------------------------------------------------------------------
def resolve_models(given: str, default_model: str) -> list[tuple[str, str]]:
    """`--conversation-models` as (label, checkpoint directory): "tiny" (DEFAULT_TINY_DIR),
    "real-shaped" (the tiny build with the real code predictor's depth, built once under .cache),
    or a directory (labelled by its name; "" : `--model`)."""
    from omnistream.cli.common import DEFAULT_TINY_DIR

    out = []
    for name in [n.strip() for n in (given or default_model).split(",") if n.strip()]:
        if name == "tiny" or Path(name) == DEFAULT_TINY_DIR:
            out.append(("tiny", str(DEFAULT_TINY_DIR)))
        elif name == "real-shaped":
            out.append(("real-shaped", str(REAL_SHAPED_DIR)))
        else:
            out.append((Path(name).name, name))
    labels = [label for label, _ in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"a checkpoint is given twice: {given}")
    return out


def _ensure_model(label: str, directory: str) -> str:
    from omnistream.cli.common import ensure_default_model

    if label == "real-shaped" and Path(directory) == REAL_SHAPED_DIR:
        from omnistream.bench.op_counts import real_shaped_model

        return real_shaped_model(directory)
    ensure_default_model(directory)
    return directory


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def padded(done: list[Turn], turns: int, error: str) -> list[Row]:
    """A conversation's turns, those it never reached (it failed: `error`) counted as failed."""
    return [t.as_dict() for t in done] + [
        Turn(turn=i, error=error).as_dict() for i in range(len(done) + 1, turns + 1)
    ]


async def _warm_up(
    client: RestGatewayClient, base_url: str, answer: Answer, workloads: Sequence[str]
) -> dict[str, str]:
    """A REST request and a one-turn realtime session (other words than the measured ones)."""
    errors = {}
    try:
        await client.chat(answer.rest_input([{"role": "user", "content": "Warm up: say anything."}]))
    except Exception as exc:
        errors["warm-up rest"] = _error(exc)
    if "realtime" in workloads:
        try:
            await realtime_conversation(base_url, 1, answer, offset=len(SENTENCES) // 2 + 3)
        except Exception as exc:
            errors["warm-up realtime"] = _error(exc)
    return errors


async def one_run(model: str, cache: str, args: argparse.Namespace, workloads: Sequence[str]) -> Row:
    """A fresh stack with the cache `cache` ("on": the default budget, "off": 0), the workloads."""
    from omnistream.bench.clients import RestGatewayClient
    from omnistream.cli.launcher import ServiceProcess
    from omnistream.cli.up import start_stack, stop_stack
    from omnistream.models.family import model_info

    answer = Answer(args.conversation_max_tokens, args.conversation_audio_frames, args.seed)
    services: dict[str, ServiceProcess] = {}
    extra: dict[str, Any] = {}
    if args.prefill_chunk is not None:
        extra["prefill_chunk"] = args.prefill_chunk
    if args.thinker_nice is not None:
        extra["thinker_nice"] = args.thinker_nice
    t0 = time.perf_counter()
    # the machine's load average (1, 5, 15 min) around the run: this machine is shared
    run: dict[str, Any] = {"cache": cache, "load_before": os.getloadavg()}
    client = None
    try:
        import shlex

        gateway = await asyncio.to_thread(
            start_stack,
            model,
            services,
            max_concurrency=max(16, 2 * args.conversation_concurrency),
            gateway_flags=shlex.split(args.gateway_args),
            prefix_cache_gib=None if cache == "on" else 0.0,
            **extra,
        )
        run["stack_start_s"] = time.perf_counter() - t0
        base_url = f"http://127.0.0.1:{gateway.http_port}"
        rate = model_info(model).sample_rate
        client = RestGatewayClient(base_url, None, rate)
        # A workload that fails (the gateway closed the session...) is recorded; the next one runs.
        errors = run["errors"] = await _warm_up(client, base_url, answer, workloads)
        turns = args.conversation_turns
        for name in ("realtime", "rest"):
            if name not in workloads:
                continue
            done: list[Turn] = []
            try:
                if name == "realtime":
                    await realtime_conversation(
                        base_url, turns, answer, out=done, turn_seconds=args.conversation_turn_seconds
                    )
                else:
                    await rest_conversation(client, turns, answer, out=done)
            except Exception as exc:
                errors[name] = _error(exc)
            run[name] = padded(done, turns, errors.get(name, "not reached"))
        if "concurrent" in workloads:
            try:
                summary, per_conversation = await concurrent_rest(
                    client, args.conversation_concurrency, args.conversation_concurrent_turns, answer
                )
                run["concurrent"] = summary
                run["concurrent_turns"] = [[t.as_dict() for t in c] for c in per_conversation]
            except Exception as exc:
                errors["concurrent"] = _error(exc)
        run["wall_s"] = time.perf_counter() - t0
        run["load_after"] = os.getloadavg()
        return run
    finally:
        if client is not None:
            await client.close()
        await asyncio.to_thread(stop_stack, services)


def _failed_turns(run: Row) -> int:
    """Failed turns of a run, a concurrency run that failed as a whole counted as one."""
    failed = sum(1 for w in ("realtime", "rest") for t in run.get(w) or [] if t.get("error"))
    broken = "concurrent" in run.get("errors", {})
    return failed + int((run.get("concurrent") or {}).get("failed", 0)) + broken


def workloads_of(given: str) -> list[str]:
    names = [n.strip() for n in given.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown or not names:
        raise ValueError(
            f"--conversation-workloads takes a comma list of {', '.join(WORKLOADS)}, got {given!r}"
        )
    return names


async def run_conversation(args: argparse.Namespace) -> int:
    from omnistream.bench.machine import machine_info

    try:
        models = resolve_models(args.conversation_models, args.model)
        workloads = workloads_of(args.conversation_workloads)
    except ValueError as exc:
        print(f"omnistream bench: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    machine = machine_info()  # at the start: what the runs' fresh stacks loaded, unless it changed
    order = plan(args.repeats)
    checkpoints: dict[str, Row] = {}
    for label, directory in models:
        model = await asyncio.to_thread(_ensure_model, label, directory)
        runs = []
        for i, cache in enumerate(order):
            print(
                f"conversation bench: {label}, cache {cache} (run {i + 1} of {len(order)})", file=sys.stderr
            )
            run = await one_run(model, cache, args, workloads)
            run["run"] = i
            runs.append(run)
            load = f"load {run['load_before'][0]:.1f} -> {run['load_after'][0]:.1f}"
            print(f"  {run['wall_s']:.0f} s, {_failed_turns(run)} failed turns, {load}", file=sys.stderr)
            for name, error in run["errors"].items():
                print(f"  {name}: {error}", file=sys.stderr)
        checkpoints[label] = {"model": model, "runs": runs, "summary": summarize_runs(runs)}
    summary = {label: c["summary"] for label, c in checkpoints.items()}
    targets = check_targets(summary, args.conversation_throughput_tolerance)
    text = report(summary, targets)
    payload = {
        "machine": machine,
        "commit_at_end": machine_info()["commit"],  # another value: the tree changed during the run
        "args": {k: (v if v != float("inf") else "inf") for k, v in vars(args).items() if k != "func"},
        "wall_seconds": time.perf_counter() - t0,
        "order": order,
        "checkpoints": checkpoints,
        "ratios": ratios(summary),
        "targets": [t.as_dict() for t in targets],
    }
    from omnistream.bench import report as bench_report

    bench_report.write_json(out_dir / "conversation.json", payload)
    (out_dir / "conversation.md").write_text(text)
    print(text)
    print(f"wrote conversation.json, conversation.md to {out_dir}")
    failed = sum(_failed_turns(r) for c in checkpoints.values() for r in c["runs"])
    return 1 if failed else 0
