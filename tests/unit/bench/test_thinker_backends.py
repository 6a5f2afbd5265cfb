"""tools/thinker-backends' summary (omnistream/bench/thinker_backends.py); the measure itself
needs both thinkers running and is a tool, not a test."""

from __future__ import annotations

from omnistream.bench.thinker_backends import Timing, percentile, table


def test_percentile_and_tpot():
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.99) == 4.0
    assert Timing(ttft=0.1, tokens=5, decode=0.4).tpot == 0.1


def test_table_shows_both_backends_and_the_chosen_turns():
    row = {
        "concurrency": 10,
        "requests": 20,
        "ttft_ms_p50": 1.0,
        "ttft_ms_p99": 2.0,
        "itl_ms_p50": 0.5,
        "itl_ms_p99": 0.9,
        "tpot_ms_p50": 0.7,
        "output_tokens_per_s": 1234.5,
    }
    results = {
        "transformers": {"waves": [row], "turn_ttft_ms": [[float(t) for t in range(1, 11)]]},
        "vllm": {"waves": [row], "turn_ttft_ms": [[10.0] * 10]},
    }
    text = table(results)
    assert "1234.5" in text and text.count("transformers") == 2 and text.count("vllm") == 2
    assert "1.0  5.0  10.0" in text
