"""`omnistream bench --voice-to-voice`'s pieces that need no stack: where the end of speech falls in
the streamed audio, the cells the flags ask for and the order their turns run in
(omnistream/bench/voice_to_voice.py)."""

from __future__ import annotations

import argparse
import asyncio

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


def test_interleaved_lengths_take_turns_a_b_then_b_a_and_each_cell_keeps_its_own_turns(monkeypatch):
    plan = [v2v.Cell("commit", 1.0, 2), v2v.Cell("commit", 9.0, 2), v2v.Cell("server_vad", 1.0, 2)]
    assert v2v.groups(plan, interleave=False) == [[c] for c in plan]
    together = v2v.groups(plan, interleave=True)
    assert together == [plan[:2], plan[2:]]  # one mode and session count
    spoken: list[tuple[int, float, int]] = []  # (session, seconds, seed) in the order they ran

    async def one_turn(url, mode, speech, window_ms, turn, seed, gap_ms=0):
        spoken.append((turn.session, speech.seconds, seed))
        turn.v2v_ms = speech.seconds
        return turn

    monkeypatch.setattr(v2v, "one_turn", one_turn)
    speech = {s: Utterance("x", bytes(int(2 * RATE * s))) for s in (1.0, 9.0)}
    args = argparse.Namespace(v2v_turns=3, v2v_window_ms=500, v2v_gap_ms=0)
    per_cell = asyncio.run(v2v.run_group("ws://unused", together[0], speech, args, seed=100))
    assert [[t.v2v_ms for t in turns] for turns in per_cell] == [[1.0] * 6, [9.0] * 6]
    assert [(t.session, t.turn) for t in per_cell[1]] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
    first_session = [seconds for session, seconds, _ in spoken if session == 0]
    assert first_session == [1.0, 9.0, 9.0, 1.0, 1.0, 9.0]  # A B, B A, A B
    seeds = [seed for _, _, seed in spoken]
    assert len(set(seeds)) == 12 and min(seeds) == 100  # every turn its own dither
    # Alone, a cell's turns have the seeds they had before groups existed (seed + session x turns + turn).
    spoken.clear()
    asyncio.run(v2v.run_group("ws://unused", [plan[2]], speech, args, seed=100))
    assert sorted(seed for _, _, seed in spoken) == list(range(100, 106))
