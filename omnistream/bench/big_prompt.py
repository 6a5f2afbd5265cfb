"""Does one huge prompt hurt anyone else? Small requests alone, then while huge prompts are refused.

A huge prompt must be refused without stalling the stack: the gateway refuses bodies over its
request limit (413) before any stage sees them, and the thinker refuses, by size and off its event
loop, a prompt under that limit that still cannot fit the model. Meanwhile `/ready` must stay 200
and a small request's latency must stay close to its latency alone. Measured side by side in one
run (ratios, not absolute times: the machine is shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from typing import Any

import httpx

SMALL = {
    "messages": [{"role": "user", "content": "Say hello."}],
    "max_tokens": 8,
    "ignore_eos": True,
    "max_audio_frames": 8,
    "talker_temperature": 0,
}


async def _small_latencies(client: httpx.AsyncClient, count: int) -> list[float]:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        reply = await client.post("/v1/chat/completions", json=SMALL)
        reply.raise_for_status()
        times.append(time.perf_counter() - started)
    return times


async def _big_prompts(
    client: httpx.AsyncClient, sizes: list[int], stop: asyncio.Event, statuses: dict[str, int]
) -> None:
    """Send huge prompts back to back until `stop`; count the statuses they get."""
    bodies = [{**SMALL, "messages": [{"role": "user", "content": "x " * (size // 2)}]} for size in sizes]
    while not stop.is_set():
        for size, body in zip(sizes, bodies, strict=True):
            reply = await client.post("/v1/chat/completions", json=body)
            key = f"{size} bytes -> {reply.status_code}"
            statuses[key] = statuses.get(key, 0) + 1


async def _watch_ready(client: httpx.AsyncClient, stop: asyncio.Event, seen: dict[str, float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        try:
            reply = await client.get("/ready", timeout=5)
            ok = reply.status_code == 200
        except httpx.HTTPError:
            ok = False
        seen["checks"] += 1
        seen["not_ready"] += 0 if ok else 1
        seen["slowest_s"] = max(seen["slowest_s"], time.perf_counter() - started)
        await asyncio.sleep(0.05)


async def big_prompt_effect(base_url: str, sizes: list[int], count: int = 8) -> dict[str, Any]:
    """Median latency of small requests alone and next to huge prompts, /ready while it happens."""
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        await _small_latencies(client, 2)  # warm-up
        alone = await _small_latencies(client, count)
        stop = asyncio.Event()
        statuses: dict[str, int] = {}
        ready = {"checks": 0, "not_ready": 0, "slowest_s": 0.0}
        async with httpx.AsyncClient(base_url=base_url, timeout=300) as big_client:
            background = [
                asyncio.ensure_future(_big_prompts(big_client, sizes, stop, statuses)),
                asyncio.ensure_future(_watch_ready(client, stop, ready)),
            ]
            try:
                await asyncio.sleep(0.5)  # the first huge prompts are in flight
                loaded = await _small_latencies(client, count)
            finally:
                stop.set()
                for task in background:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(task, 300)
    alone_ms = 1000 * statistics.median(alone)
    loaded_ms = 1000 * statistics.median(loaded)
    return {
        "small_alone_median_ms": alone_ms,
        "small_with_big_prompts_median_ms": loaded_ms,
        "latency_ratio": loaded_ms / alone_ms,
        "big_prompt_statuses": statuses,
        "ready_checks": ready["checks"],
        "ready_not_200": ready["not_ready"],
        "ready_slowest_ms": 1000 * ready["slowest_s"],
    }
