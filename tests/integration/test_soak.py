"""Soak (slow, `make test-slow`): a randomized mix of requests against the whole stack.

It found a lock-order deadlock that only showed as one request stuck until its timeout in a few
hundred; every request here must end, with its full result, within a bound.
"""

from __future__ import annotations

import asyncio
import os
import random
import time

import pytest

from omnistream.bench.clients import GrpcGatewayClient, Workload
from omnistream.cli.up import start_stack
from omnistream.models.qwen3_omni.checkpoint import load_config, load_tokenizer
from omnistream.models.qwen3_omni.random_prompts import random_prompts

SOAK_SECONDS = float(os.environ.get("OMNISTREAM_SOAK_SECONDS", "240"))


@pytest.mark.slow
@pytest.mark.timeout(SOAK_SECONDS + 300)
def test_randomized_mix_never_hangs_or_fails(tiny_model_dir):
    config, tokenizer = load_config(tiny_model_dir), load_tokenizer(tiny_model_dir)
    services: dict = {}
    try:
        # The hold off: on a CPU the tiny talker holds bursts of 10 audio streams past the queue
        # timeout (429), and this test is about hangs, not about admission.
        gateway = start_stack(tiny_model_dir, services, max_concurrency=20, audio_hold=False)

        async def run() -> int:
            client = GrpcGatewayClient(gateway.address)
            rng = random.Random(1)
            done = 0
            started = time.monotonic()
            while time.monotonic() - started < SOAK_SECONDS:
                concurrency = rng.choice([1, 4, 10])
                prompts = random_prompts(
                    config, tokenizer, concurrency, rng.choice([16, 100, 300]), seed=done
                )
                workload = Workload(
                    rng.choice([5, 50, 100]), rng.choice([20, 60, 150]), True, rng.choice([None, 2, 4])
                )
                async_chunk = rng.choice([True, False])
                results = await asyncio.wait_for(
                    asyncio.gather(*(client.run(p, workload, async_chunk) for p in prompts)), 120
                )
                failed = [r.error for r in results if not r.ok]
                assert not failed, failed
                done += len(results)
            await client.close()
            return done

        assert asyncio.run(run()) > 0
    finally:
        for service in reversed(list(services.values())):
            service.stop()
