"""`omnistream bench --conversation` (omnistream/bench/conversation.py): the turn bookkeeping, the
merge over runs, the tables, the ratios and the target checks. The measure itself starts stacks:
tests/integration/test_bench_conversation.py runs it end to end."""

from __future__ import annotations

import argparse
import base64
import json

import pytest

from omnistream.bench.args import add_arguments
from omnistream.bench.conversation import (
    SENTENCES,
    Target,
    Turn,
    check_targets,
    concurrent_table,
    growth,
    merge_concurrent,
    merge_turns,
    plan,
    ratios,
    realtime_turn_from_events,
    report,
    resolve_models,
    summarize_runs,
    turn_from_result,
    turn_table,
    user_text,
    window_growth,
    workloads_of,
)
from omnistream.bench.speech import until
from omnistream.bench.stats import RequestResult


def _turns(ttfts: list[float], cached_share: float = 0.9, error_at: int | None = None) -> list[dict]:
    rows = []
    for i, ttft in enumerate(ttfts, 1):
        tokens = 50 * i
        turn = Turn(i, ttft, ttft + 40.0, ttft + 200.0, tokens, round(cached_share * tokens), 16, 1.9)
        if i == error_at:
            turn.error = "boom"
        rows.append(turn.as_dict())
    return rows


def test_a_turn_knows_its_cached_share_and_says_none_without_usage():
    assert Turn(1, input_tokens=200, cached_tokens=150).cached_share == 0.75
    assert Turn(1).cached_share is None
    assert Turn(1, input_tokens=0, cached_tokens=0).cached_share is None
    assert Turn(2, input_tokens=10, cached_tokens=5).as_dict()["cached_share"] == 0.5


def test_a_rest_turn_is_read_from_the_clients_record():
    result = RequestResult(ok=True, start=10.0, end=10.5, tokens=16, prompt_tokens=120, cached_tokens=96)
    result.token_times = [10.02, 10.1]
    result.add_audio(10.05, 24_000, 24_000)
    turn = turn_from_result(3, result)
    assert turn.turn == 3 and turn.ttft_ms == pytest.approx(20.0) and turn.ttfp_ms == pytest.approx(50.0)
    assert turn.e2e_ms == pytest.approx(500.0) and turn.audio_seconds == 1.0
    assert (turn.input_tokens, turn.cached_tokens, turn.cached_share, turn.error) == (120, 96, 0.8, "")
    assert turn_from_result(1, RequestResult(error="HTTP 429")).error == "HTTP 429"
    assert turn_from_result(1, RequestResult()).error == "failed"


def test_a_realtime_turn_is_read_from_its_events():
    audio = base64.b64encode(bytes(2 * 2400)).decode()  # 2400 samples at 24 kHz: 0.1 s
    events = [
        (0.005, {"type": "response.created"}),
        (0.010, {"type": "response.output_audio_transcript.delta", "delta": ""}),  # empty: not text yet
        (0.020, {"type": "response.output_audio_transcript.delta", "delta": "hi"}),
        (0.050, {"type": "response.output_audio.delta", "delta": audio}),
        (0.070, {"type": "response.output_audio.delta", "delta": audio}),
        (
            0.300,
            {
                "type": "response.done",
                "response": {
                    "status": "incomplete",  # what a max_output_tokens answer is called
                    "status_details": {"type": "incomplete", "reason": "max_output_tokens"},
                    "usage": {"input_tokens": 300, "output_tokens": 16,
                              "input_token_details": {"cached_tokens": 270}},
                    "omnistream": {"ttft_ms": 12.5},
                },
            },
        ),
    ]  # fmt: skip
    turn = realtime_turn_from_events(4, 0.0, events, 24_000)
    assert turn.ttft_ms == pytest.approx(20.0) and turn.ttfp_ms == pytest.approx(50.0)
    assert turn.e2e_ms == pytest.approx(300.0) and turn.audio_seconds == pytest.approx(0.2)
    assert (turn.input_tokens, turn.cached_tokens, turn.output_tokens) == (300, 270, 16)
    assert turn.cached_share == 0.9 and turn.error == "" and turn.gateway_ttft_ms == 12.5
    failed = [(0.1, {"type": "response.done", "response": {"status": "failed", "status_details": None}})]
    assert "failed" in realtime_turn_from_events(1, 0.0, failed, 24_000).error


def test_the_turns_are_the_sentences_in_order_and_rotate_for_another_conversation():
    assert user_text(1) == SENTENCES[0] and user_text(20) == SENTENCES[19] and user_text(21) == SENTENCES[0]
    assert user_text(1, offset=3) == SENTENCES[3]
    assert len(set(SENTENCES)) == len(SENTENCES) == 20


def test_the_cache_settings_run_a_b_b_a():
    assert plan(2) == ["on", "off", "off", "on"]
    assert plan(1) == ["on", "off"]
    assert plan(4) == ["on", "off", "off", "on", "on", "off", "off", "on"]


def test_runs_merge_per_turn_by_their_median_and_failed_turns_are_counted_not_averaged():
    merged = merge_turns([_turns([10.0, 20.0, 30.0]), _turns([30.0, 40.0, 90.0], error_at=3)])
    assert [m["turn"] for m in merged] == [1, 2, 3]
    assert merged[0]["ttft_ms"] == 20.0 and merged[0]["ttft_ms_runs"] == [10.0, 30.0]
    assert merged[2]["ttft_ms"] == 30.0 and merged[2]["errors"] == 1 and merged[2]["runs"] == 2
    assert merged[1]["cached_share"] == pytest.approx(0.9)
    assert merge_turns([]) == []


def test_growth_is_the_last_turn_over_turn_two():
    rows = merge_turns([_turns([50.0, 10.0, 12.0, 15.0])])
    assert growth(rows) == pytest.approx(1.5)
    assert growth(rows, last=3) == pytest.approx(1.2)
    assert growth([]) is None
    assert growth(merge_turns([_turns([5.0])])) is None  # no turn 2


def test_the_window_growth_is_robust_to_one_slow_turn():
    rows = merge_turns([_turns([30.0, 10.0, 11.0, 12.0, 50.0, 12.0, 13.0, 100.0, 14.0])])
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


def _summary(on_ttfts, off_ttfts, on_share=0.9, on_audio=10.0, off_audio=10.0) -> dict:
    def run(cache, ttfts, share, audio):
        conc = {"concurrency": 10, "turns_each": 10, "audio_throughput": audio,
                "output_token_throughput": 8 * audio, "turn_throughput": audio / 2, "ttft_ms_mean": 30.0,
                "turns": 100, "failed": 0}  # fmt: skip
        turns = _turns(ttfts, share)
        return {"cache": cache, "realtime": turns, "rest": turns, "concurrent": conc}

    runs = [run("on", on_ttfts, on_share, on_audio), run("off", off_ttfts, 0.0, off_audio)]
    return summarize_runs(runs)


def test_the_targets_pass_and_fail_on_their_limits_per_checkpoint():
    ttfts = [30.0, 20.0] + [22.0] * 17 + [25.0]  # turn 20 / turn 2 = 1.25
    summary = {"tiny": _summary(ttfts, [30.0] * 20), "real-shaped": _summary([30.0, 20.0, 31.0], [30.0] * 3)}
    targets = {(t.checkpoint, t.name): t for t in check_targets(summary)}
    tiny_growth = targets[("tiny", "realtime: TTFT turn 20 / turn 2, cache on")]
    assert tiny_growth.value == pytest.approx(1.25) and tiny_growth.limit == 1.25 and tiny_growth.passed
    shaped = targets[("real-shaped", "rest: TTFT turn 3 / turn 2, cache on")]
    assert shaped.limit == 1.5 and shaped.value == pytest.approx(1.55) and not shaped.passed
    share = targets[("tiny", "rest: cached share of the input at turn 20, cache on")]
    assert share.passed and share.limit == 0.8
    conc = targets[("tiny", "concurrent (c10): audio s/s cache on / off (tolerance 0.05)")]
    assert conc.value == 1.0 and conc.passed

    low = check_targets({"tiny": _summary(ttfts, ttfts, on_share=0.5, on_audio=9.0, off_audio=10.0)})
    failed = {t.name for t in low if not t.passed}
    assert "realtime: cached share of the input at turn 20, cache on" in failed
    assert "concurrent (c10): audio s/s cache on / off (tolerance 0.05)" in failed
    within = check_targets({"tiny": _summary(ttfts, ttfts, on_audio=9.6)}, tolerance=0.05)
    assert all(t.passed for t in within)  # 4% less audio s/s: within the tolerance
    assert not all(t.passed for t in check_targets({"tiny": _summary(ttfts, ttfts, on_audio=9.6)}, 0.0))


def test_a_target_without_a_value_fails_and_says_so():
    target = Target("x", "tiny", None, 1.25, True)
    assert not target.passed and target.line().startswith("FAIL") and "n/a" in target.line()
    assert Target("y", "tiny", 0.81, 0.8, False).line() == "PASS  [tiny] y: 0.810 (>= 0.8)"
    assert json.dumps(target.as_dict())


def test_the_turn_table_shows_the_chosen_turns_and_the_last():
    on = merge_turns([_turns([float(t) for t in range(1, 13)])])
    off = merge_turns([_turns([2.0 * t for t in range(1, 13)], cached_share=0.0)])
    lines = turn_table(on, off).splitlines()
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["1", "2", "5", "10", "12"]
    assert lines[3].split("|")[2].strip() == "2.0" and lines[3].split("|")[3].strip() == "4.0"
    assert "90%" in lines[3] and "gateway" not in lines[0]  # REST turns: no gateway column
    spoken = merge_turns(
        [[{**row, "gateway_ttft_ms": row["ttft_ms"] / 2} for row in _turns([4.0, 6.0, 8.0])]]
    )
    lines = turn_table(spoken, off).splitlines()
    assert lines[0].endswith("gateway TTFT on ms |") and lines[3].split("|")[-2].strip() == "3.0"


def test_the_report_has_every_workload_and_every_target():
    summary = {"tiny": _summary([30.0, 20.0, 22.0], [30.0, 25.0, 40.0])}
    targets = check_targets(summary)
    text = report(summary, targets)
    assert "### tiny: realtime, 3 turns" in text and "### tiny: rest, 3 turns" in text
    assert "TTFT turn 3 / turn 2: cache on 1.10x, off 1.60x" in text
    assert "### tiny: concurrent REST conversations" in text and "| on | 10 x 10 | 0 | 10.00 (10.00)" in text
    assert text.count("PASS") + text.count("FAIL") == len(targets) == 5
    assert "| off |" in concurrent_table(None, summary["tiny"]["off"]["concurrent"])
    named = ratios(summary)
    assert named["tiny rest cache off: TTFT turn 3 / turn 2"] == pytest.approx(1.6)
    assert named["tiny realtime cache on: cached share at turn 3"] == pytest.approx(0.9, abs=0.01)
    assert named["tiny concurrent: audio s/s cache on / off"] == 1.0


def test_models_and_workloads_are_parsed():
    assert resolve_models("tiny,real-shaped", "x") == [
        ("tiny", ".cache/tiny-model"),
        ("real-shaped", ".cache/real-shaped-model"),
    ]
    assert resolve_models("", ".cache/tiny-model") == [("tiny", ".cache/tiny-model")]
    assert resolve_models("/ckpt/qwen-omni", "x") == [("qwen-omni", "/ckpt/qwen-omni")]
    with pytest.raises(ValueError, match="twice"):
        resolve_models("tiny,tiny", "x")
    assert workloads_of("rest, realtime") == ["rest", "realtime"]
    for bad in ("", "rest,chat"):
        with pytest.raises(ValueError):
            workloads_of(bad)


def test_the_flags_default_to_the_issues_workload():
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--conversation"])
    assert args.conversation and args.conversation_turns == 20 and args.conversation_concurrency == 10
    assert args.conversation_workloads == "realtime,rest,concurrent" and args.repeats == 2
    assert args.conversation_turn_seconds == 0.0  # the speech alone, as the issue measured
    assert not p.parse_args([]).conversation


def test_a_spoken_turn_ends_in_silence_up_to_its_length_and_a_longer_one_is_whole():
    speech = b"\x01\x02" * 24_000  # 1 s of pcm16 at 24 kHz
    padded = until(speech, 2.5)
    assert len(padded) == 2 * 60_000 and padded[: len(speech)] == speech and not any(padded[len(speech) :])
    assert until(speech, 0.5) == speech and until(speech, 0.0) == speech
