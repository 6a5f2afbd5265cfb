"""Runs merged per turn, the growth ratios and the targets (omnistream/bench/conversation/summary.py)."""

from __future__ import annotations

import json

import pytest

from omnistream.bench.conversation.summary import (
    Target,
    check_targets,
    growth,
    merge_concurrent,
    merge_turns,
    window_growth,
)
from tests.unit.bench.conversation.fake_runs import checkpoint_summary, turn_rows


def test_runs_merge_per_turn_by_their_median_and_failed_turns_are_counted_not_averaged():
    merged = merge_turns([turn_rows([10.0, 20.0, 30.0]), turn_rows([30.0, 40.0, 90.0], error_at=3)])
    assert [m["turn"] for m in merged] == [1, 2, 3]
    assert merged[0]["ttft_ms"] == 20.0 and merged[0]["ttft_ms_runs"] == [10.0, 30.0]
    assert merged[2]["ttft_ms"] == 30.0 and merged[2]["errors"] == 1 and merged[2]["runs"] == 2
    assert merged[1]["cached_share"] == pytest.approx(0.9)
    assert merge_turns([]) == []


def test_growth_is_the_last_turn_over_turn_two():
    rows = merge_turns([turn_rows([50.0, 10.0, 12.0, 15.0])])
    assert growth(rows) == pytest.approx(1.5)
    assert growth(rows, last=3) == pytest.approx(1.2)
    assert growth([]) is None
    assert growth(merge_turns([turn_rows([5.0])])) is None  # no turn 2


def test_the_window_growth_is_robust_to_one_slow_turn():
    rows = merge_turns([turn_rows([30.0, 10.0, 11.0, 12.0, 50.0, 12.0, 13.0, 100.0, 14.0])])
    assert growth(rows) == pytest.approx(1.4)
    assert window_growth(rows) == pytest.approx(14.0 / 11.0)  # medians of turns 7-9 and 2-4
    assert window_growth(rows[:6]) is None  # fewer than 7 turns: the windows would overlap


def test_concurrency_runs_merge_by_their_mean():
    runs = [
        {"audio_throughput": 10.0, "output_token_throughput": 80.0, "turn_throughput": 5.0,
         "ttft_ms_mean": 40.0, "turns": 100, "failed": 0},
        {"audio_throughput": 12.0, "output_token_throughput": 100.0, "turn_throughput": 6.0,
         "ttft_ms_mean": None, "turns": 100, "failed": 1},
    ]  # fmt: skip
    merged = merge_concurrent(runs)
    assert merged["audio_throughput"] == 11.0 and merged["audio_throughput_runs"] == [10.0, 12.0]
    assert merged["ttft_ms_mean"] == 40.0 and merged["turns"] == 200 and merged["failed"] == 1


def test_the_targets_pass_and_fail_on_their_limits_per_checkpoint():
    ttfts = [30.0, 20.0] + [22.0] * 17 + [25.0]  # turn 20 / turn 2 = 1.25
    summary = {
        "tiny": checkpoint_summary(ttfts, [30.0] * 20),
        "real-shaped": checkpoint_summary([30.0, 20.0, 31.0], [30.0] * 3),
    }
    targets = {(t.checkpoint, t.name): t for t in check_targets(summary)}
    tiny_growth = targets[("tiny", "realtime: TTFT turn 20 / turn 2, cache on")]
    assert tiny_growth.value == pytest.approx(1.25) and tiny_growth.limit == 1.25 and tiny_growth.passed
    shaped = targets[("real-shaped", "rest: TTFT turn 3 / turn 2, cache on")]
    assert shaped.limit == 1.5 and shaped.value == pytest.approx(1.55) and not shaped.passed
    share = targets[("tiny", "rest: cached share of the input at turn 20, cache on")]
    assert share.passed and share.limit == 0.8
    conc = targets[("tiny", "concurrent (c10): audio s/s cache on / off (tolerance 0.05)")]
    assert conc.value == 1.0 and conc.passed

    low = check_targets(
        {"tiny": checkpoint_summary(ttfts, ttfts, on_share=0.5, on_audio=9.0, off_audio=10.0)}
    )
    failed = {t.name for t in low if not t.passed}
    assert "realtime: cached share of the input at turn 20, cache on" in failed
    assert "concurrent (c10): audio s/s cache on / off (tolerance 0.05)" in failed
    within = check_targets({"tiny": checkpoint_summary(ttfts, ttfts, on_audio=9.6)}, tolerance=0.05)
    assert all(t.passed for t in within)  # 4% less audio s/s: within the tolerance
    assert not all(
        t.passed for t in check_targets({"tiny": checkpoint_summary(ttfts, ttfts, on_audio=9.6)}, 0.0)
    )


def test_a_target_without_a_value_fails_and_says_so():
    target = Target("x", "tiny", None, 1.25, True)
    assert not target.passed and target.line().startswith("FAIL") and "n/a" in target.line()
    assert Target("y", "tiny", 0.81, 0.8, False).line() == "PASS  [tiny] y: 0.810 (>= 0.8)"
    assert json.dumps(target.as_dict())
