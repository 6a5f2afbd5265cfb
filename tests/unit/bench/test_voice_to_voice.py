"""`omnistream bench --voice-to-voice`'s pieces that need no stack: where the end of speech falls in
the streamed audio, the cells the flags ask for, the table (omnistream/bench/voice_to_voice.py)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from omnistream.bench import voice_to_voice as v2v
from omnistream.bench.speech import RATE, Utterance, dithered, pieces, trimmed


def test_the_speech_ends_with_the_piece_the_end_of_speech_is_timed_at():
    speech = np.full(RATE + 77, 1000, dtype="<i2").tobytes()  # not a whole number of pieces
    stream, last = v2v.layout(speech, trailing_s=0.7)
    chunks = pieces(stream, v2v.PIECE_MS)
    spoken = b"".join(chunks[: last + 1])
    assert spoken.endswith(speech) and len(spoken) >= 2 * round(v2v.LEAD_S * RATE) + len(speech)
    assert not any(b"".join(chunks[last + 1 :]))  # silence after it, 0.7 s of it
    assert len(stream) - len(spoken) == 2 * round(0.7 * RATE)


def test_a_gap_is_silence_in_the_middle_of_the_speech_which_still_ends_with_its_piece():
    speech = np.full(RATE, 1000, dtype="<i2").tobytes()
    stream, last = v2v.layout(speech, trailing_s=0.7, gap_ms=350)
    spoken = b"".join(pieces(stream, v2v.PIECE_MS)[: last + 1])
    half = len(speech) // 2
    assert spoken.endswith(speech[:half] + bytes(2 * round(0.35 * RATE)) + speech[half:])


def test_trimmed_and_dithered_speech():
    samples = np.array([0, 3, -50, 4000, -200, 7, 0], dtype="<i2")
    assert np.frombuffer(trimmed(samples.tobytes()), "<i2").tolist() == [4000, -200]
    utterance = Utterance("x", np.full(RATE // 2, 500, dtype="<i2").tobytes())
    assert utterance.seconds == 0.5
    a, b = dithered(utterance.pcm, 1), dithered(utterance.pcm, 2)
    assert a != b and a == dithered(utterance.pcm, 1)
    assert np.abs(np.frombuffer(a, "<i2").astype(int) - 500).max() <= 1


def test_cells_run_mode_by_length_by_sessions_and_refuse_nonsense():
    args = argparse.Namespace(
        v2v_modes="server_vad,commit", v2v_seconds="1,4", v2v_sessions="1,8", v2v_turns=3
    )
    cells = v2v.cells(args)
    assert cells[:3] == [
        v2v.Cell("server_vad", 1.0, 1),
        v2v.Cell("server_vad", 1.0, 8),
        v2v.Cell("server_vad", 4.0, 1),
    ]
    assert len(cells) == 8 and cells[-1] == v2v.Cell("commit", 4.0, 8)
    for bad in ({"v2v_modes": "semantic_vad"}, {"v2v_sessions": "0"}, {"v2v_turns": 0}):
        with pytest.raises(ValueError):
            v2v.cells(argparse.Namespace(**{**vars(args), **bad}))


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
    row = v2v.summarize(v2v.Cell("server_vad", 1.0, 1), speech, 500, turns, {"released": 3.0, "resumed": 0.0})
    assert row["failed"] == 1 and row["errors"] == ["no audio"] and row["v2v_ms"]["samples"] == 3
    text = v2v.table([row])
    times = "701 / 702 | 600 / 600 | 101 / 102 | - | 320 / 448"
    assert f"| server_vad 500 ms | 1.00 | 1 | 3/4 | {times} | 67% | released 3 |" in text
    unread = v2v.summarize(v2v.Cell("commit", 1.0, 1), speech, 500, turns[3:], None)
    assert v2v.table([unread]).splitlines()[2].endswith("| - | - | - | - | - | - | - |")
