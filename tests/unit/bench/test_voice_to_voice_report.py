"""The voice-to-voice bench's rows and table (omnistream/bench/voice_to_voice_report.py)."""

from __future__ import annotations

from omnistream.bench import voice_to_voice as v2v
from omnistream.bench.speech import RATE, Utterance
from omnistream.bench.voice_to_voice_report import summarize, table


def test_the_table_gives_median_and_p90_and_a_dash_without_samples():
    turns = [
        v2v.Turn(
            "server_vad",
            0,
            i,
            0.9,
            v2v_ms=700.0 + i,
            detector_ms=600.0,
            after_detector_ms=100.0 + i,
            continuity_ok=i > 0,
            first_chunk_ms=160.0 * (i + 1),
        )
        for i in range(3)
    ]
    turns.append(v2v.Turn("server_vad", 0, 3, 0.9, error="no audio"))
    speech = Utterance("Hello.", bytes(2 * RATE))
    row = summarize(v2v.Cell("server_vad", 1.0, 1), speech, 500, turns, {"released": 3.0, "resumed": 0.0})
    assert row["failed"] == 1 and row["errors"] == ["no audio"] and row["v2v_ms"]["samples"] == 3
    text = table([row])
    times = "701 / 702 | 600 / 600 | 101 / 102 | - | 320 / 448"
    assert f"| server_vad 500 ms | 1.00 | 1 | 3/4 | {times} | 67% | released 3 |" in text
    unread = summarize(v2v.Cell("commit", 1.0, 1), speech, 500, turns[3:], None)
    assert table([unread]).splitlines()[2].endswith("| - | - | - | - | - | - | - |")


def test_an_interleaved_table_says_its_lengths_took_turns():
    speech = Utterance("Hello.", bytes(2 * RATE))
    turns = [v2v.Turn("commit", 0, 0, 1.0, v2v_ms=60.0)]
    row = summarize(v2v.Cell("commit", 1.0, 1), speech, 500, turns, None)
    assert "took turns" not in table([row])
    assert "took turns" in table([{**row, "interleaved": True}])
