"""The long-prompt measurement: its step accounting, and one small real run (no timings asserted)."""

from __future__ import annotations

import asyncio
import math

from omnistream.bench.long_prompt import _StepClock, describe, measure


class _Running:
    def __init__(self) -> None:
        self.count = 0


def test_step_clock_counts_the_gaps_that_end_while_the_long_prompt_prefills():
    a, b = _Running(), _Running()
    now = [0.0]
    started = [False]
    clock = _StepClock([a, b], lambda s: s.count, lambda: started[0], clock=lambda: now[0])

    def step(t: float, da: int, db: int, long_started: bool = False) -> None:
        now[0] = t
        a.count += da
        b.count += db
        started[0] = long_started
        clock(None, 0.0)

    for t in (0.0, 1.0, 2.0):  # steady: a token each per second
        step(t, 1, 1)
    clock.added = 2.5  # the long prompt arrives
    step(3.0, 1, 0)  # a piece: `a` decodes, `b` gets nothing this step
    step(4.0, 1, 1, long_started=True)  # the last piece: the long request's first token
    step(5.0, 1, 1)  # after it: not part of the prefill any more
    summary = clock.summary()
    assert summary["itl_before"]["count"] == 4 and summary["itl_before"]["max_ms"] == 1000.0
    during = summary["itl_during_prefill"]
    assert during["count"] == 3 and during["max_ms"] == 2000.0  # `b` waited two seconds
    assert summary["long_ttft_ms"] == 1500.0


def test_a_small_real_measurement(tiny_model_dir):
    """64-token prompt in 16-token pieces: each running request gets a token (thinker) or frame
    (talker) after every piece, so at least one gap per piece ends while it prefills."""
    result = asyncio.run(measure(tiny_model_dir, 64, prefill_chunk=16, running=1, warm=2))
    assert result["thinker"]["itl_during_prefill"]["count"] >= math.ceil(64 / 16)
    assert result["talker"]["itl_during_prefill"]["count"] >= math.ceil(64 / 16)
    for stage in ("thinker", "talker"):
        assert result[stage]["long_ttft_ms"] > 0 and result[stage]["itl_before"]["count"] >= 2
    assert "while it prefills" in describe("x", result)
