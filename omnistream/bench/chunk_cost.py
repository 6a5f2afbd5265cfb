"""CPU per chunk at each stage edge (`omnistream bench --chunk-cost`), read from the stages' own
`omnistream_stage_chunk_cpu_seconds` histograms before and after a few requests through the services."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING

from omnistream.bench.clients import BenchClient, Workload

if TYPE_CHECKING:
    from omnistream.cli.launcher import ServiceProcess

# (count, input_len, seed) -> prompts of exactly input_len ids, in the model family's chat framing.
PromptMaker = Callable[[int, int, int], list[list[int]]]


def _scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values: dict[str, float] = {}
    for line in body.splitlines():
        m = re.match(
            r'^omnistream_stage_chunk_cpu_seconds_(sum|count)\{direction="(\w+)",stage="(\w+)"\} (\S+)', line
        )
        if m:
            values[f"{m.group(3)}.{m.group(2)}.{m.group(1)}"] = float(m.group(4))
    return values


async def chunk_cost(
    client: BenchClient,
    services: dict[str, ServiceProcess],
    make_prompts: PromptMaker,
    lengths: list[int],
    seed: int,
) -> dict[int, dict[str, float]]:
    """CPU per thinker->talker chunk (thinker out + talker in) and per talker->code2wav chunk (talker
    out + code2wav in), through the services, by prompt length."""
    ports = [s.metrics_port for name, s in services.items() if name != "gateway"]
    results = {}
    workload = Workload(output_len=100, audio_frames=60, ignore_eos=True, initial_codec_chunk_frames=4)
    for length in lengths:
        prompts = make_prompts(4, length, seed + length)
        await client.run(prompts[0], workload, True)  # warm the prompt length
        before: dict[str, float] = {}
        for port in ports:
            before.update(_scrape(port))
        for prompt in prompts[1:]:
            result = await client.run(prompt, workload, True)
            if not result.ok:
                raise RuntimeError(f"chunk-cost request failed: {result.error}")
        after: dict[str, float] = {}
        for port in ports:
            after.update(_scrape(port))

        def per_chunk(
            stage: str, direction: str, after: dict[str, float] = after, before: dict[str, float] = before
        ) -> float:
            d_sum = after[f"{stage}.{direction}.sum"] - before.get(f"{stage}.{direction}.sum", 0.0)
            d_count = after[f"{stage}.{direction}.count"] - before.get(f"{stage}.{direction}.count", 0.0)
            if not d_count:
                raise RuntimeError(f"chunk cost: {stage} reported no {direction!r} chunk")
            return d_sum / d_count

        results[length] = {
            "thinker_to_talker_us": 1e6 * (per_chunk("thinker", "out") + per_chunk("talker", "in")),
            "talker_to_code2wav_us": 1e6 * (per_chunk("talker", "out") + per_chunk("code2wav", "in")),
        }
    return results
