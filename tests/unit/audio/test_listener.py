"""The listener model on hand-made timelines (times in seconds; 1000 samples at 10 kHz = 0.1 s),
and against vLLM-Omni's `audio_underrun` arithmetic written out independently."""

from __future__ import annotations

import random

import pytest

from omnistream.audio.listener import CONTINUITY_THRESHOLD_S, AudioArrival, listen

RATE = 10_000


def chunk(time: float, seconds: float, rate: int = RATE) -> AudioArrival:
    return AudioArrival(time, round(seconds * rate), rate)


def test_chunks_that_arrive_before_the_audio_runs_out_never_stall():
    heard = listen([chunk(1.0, 0.5), chunk(1.2, 0.5), chunk(1.5, 0.5), chunk(2.0, 0.5)])
    assert (heard.stalls, heard.stall_s, heard.longest_stall_s) == (0, 0.0, 0.0)
    assert heard.continuity_ok and heard.chunks == 4
    assert heard.audio_s == pytest.approx(2.0)


def test_a_chunk_arriving_exactly_as_the_audio_ends_is_no_stall():
    heard = listen([chunk(0.1, 0.3), chunk(0.4, 0.3), chunk(0.7, 0.3)])
    assert heard.stalls == 0 and heard.stall_s == 0.0


def test_one_stall_after_the_first_chunk():
    # 0.16 s of audio from t=1.0 runs out at 1.16; the next chunk comes at 1.5: a 0.34 s wait.
    heard = listen([chunk(1.0, 0.16), chunk(1.5, 2.0), chunk(2.0, 2.0)])
    assert heard.stalls == 1
    assert heard.stall_s == pytest.approx(0.34)
    assert heard.longest_stall_s == pytest.approx(0.34)
    assert heard.underrun_s == pytest.approx(0.34)
    assert not heard.continuity_ok


def test_the_second_chunk_arriving_while_the_first_plays_is_no_stall_and_its_audio_queues():
    # The first chunk plays 1.0..2.0; the second arrives at 1.5 and plays 2.0..2.5; the third at
    # 2.4 still finds audio queued, the fourth at 3.0 finds the buffer empty since 2.9: 0.1 s.
    heard = listen([chunk(1.0, 1.0), chunk(1.5, 0.5), chunk(2.4, 0.4), chunk(3.0, 0.1)])
    assert heard.stalls == 1
    assert heard.stall_s == pytest.approx(0.1)


def test_several_stalls_add_up_and_the_longest_is_kept():
    # plays 0..0.1, waits 0.2; plays 0.3..0.4, waits 0.05; plays 0.45..0.55, waits 0.45
    heard = listen([chunk(0.0, 0.1), chunk(0.3, 0.1), chunk(0.45, 0.1), chunk(1.0, 0.1)])
    assert heard.stalls == 3
    assert heard.stall_s == pytest.approx(0.7)
    assert heard.longest_stall_s == pytest.approx(0.45)
    assert not heard.continuity_ok


def test_continuity_is_the_underrun_against_the_threshold():
    short = listen([chunk(0.0, 0.1), chunk(0.15, 0.1), chunk(0.3, 0.1)])  # two waits of 0.05
    assert short.stalls == 2 and short.underrun_s == pytest.approx(0.1)
    assert short.continuity_ok  # 0.1 <= 0.1, as vLLM-Omni judges it
    assert not listen([chunk(0.0, 0.1), chunk(0.15, 0.1), chunk(0.31, 0.1)]).continuity_ok
    assert listen([chunk(0.0, 0.1), chunk(0.6, 0.1)], threshold_s=0.5).continuity_ok
    assert CONTINUITY_THRESHOLD_S == 0.1


def test_chunks_at_different_sample_rates_play_for_their_own_durations():
    # 2400 samples at 24 kHz = 0.1 s, 1600 at 16 kHz = 0.1 s, 4800 at 48 kHz = 0.1 s.
    arrivals = [
        AudioArrival(0.0, 2400, 24_000),
        AudioArrival(0.1, 1600, 16_000),
        AudioArrival(0.25, 4800, 48_000),
    ]
    heard = listen(arrivals)
    assert heard.audio_s == pytest.approx(0.3)
    assert heard.stalls == 1 and heard.stall_s == pytest.approx(0.05)
    # Read at one rate, the 16 kHz chunk would be 0.067 s and the gap after it larger.
    assert listen([AudioArrival(t, n, 24_000) for t, n, _ in arrivals]).stall_s > 0.08


def test_empty_chunks_are_not_audio():
    # An empty chunk first does not start the player; one in a gap does not end the stall.
    heard = listen(
        [AudioArrival(0.0, 0, RATE), chunk(0.5, 0.1), AudioArrival(0.65, 0, RATE), chunk(0.8, 0.1)]
    )
    assert heard.chunks == 2
    assert heard.stalls == 1 and heard.stall_s == pytest.approx(0.2)


def test_no_audio_at_all_is_no_stall():
    for arrivals in ([], [AudioArrival(1.0, 0, RATE), AudioArrival(2.0, 0, RATE)]):
        heard = listen(arrivals)
        assert not heard.heard
        assert (heard.chunks, heard.stalls, heard.stall_s, heard.audio_s) == (0, 0, 0.0, 0.0)
        assert heard.continuity_ok


def test_invalid_chunks_are_refused():
    with pytest.raises(ValueError):
        listen([AudioArrival(0.0, 100, 0)])
    with pytest.raises(ValueError):
        listen([AudioArrival(0.0, -1, RATE)])
    with pytest.raises(ValueError):
        listen([chunk(0.0, 0.1)], threshold_s=-0.1)


def _vllm_omni_underrun(arrivals: list[AudioArrival]) -> float:
    """vLLM-Omni's audio_underrun, from its description: a player started at the first chunk that
    never pauses; at each later arrival, how much more it would have played than was received."""
    audio = [a for a in arrivals if a.samples]
    worst, received = 0.0, 0.0
    for i, a in enumerate(audio):
        if i:
            worst = max(worst, (a.time - audio[0].time) - received)
        received += a.samples / a.sample_rate
    return worst


def test_the_underrun_equals_vllm_omnis_audio_underrun_on_random_timelines():
    rng = random.Random(7)
    for _ in range(300):
        t, arrivals = rng.uniform(0, 2), []
        for _ in range(rng.randint(1, 12)):
            rate = rng.choice([16_000, 24_000, 48_000])
            arrivals.append(AudioArrival(t, rng.choice([0, rng.randint(1, rate)]), rate))
            t += rng.expovariate(3.0)
        assert listen(arrivals).underrun_s == pytest.approx(_vllm_omni_underrun(arrivals), abs=1e-6)
