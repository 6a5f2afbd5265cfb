"""The listener model: what a person hears from a streamed answer, given when its audio arrived.

One function, `listen`, used by every place that judges a stream (the benchmark's clients, the
gateway's metrics, the realtime API's response.done), so their numbers are one definition.

The player starts when the first non-empty audio chunk arrives and plays in real time. When its
buffer runs dry before the next chunk, it waits (a stall) and resumes the moment that chunk
arrives. Empty chunks (a final marker, a conversion that produced nothing) are not audio.

`underrun_s` is vLLM-Omni's per-request `audio_underrun` (`vllm bench serve --omni`): the worst
deficit between the audio a never-pausing player started at the first chunk would have played and
the audio received, over the chunk arrivals. That deficit only grows with each stall, so it equals
this player's total stall time; it is kept under vLLM-Omni's name so the numbers compare. Their
"streaming continuity OK" is `underrun_s <= threshold` (0.1 s by default): the same test here.
`longest_stall_s` is the longest single wait, the one gap a listener hears worst.

Torch-free and pure arithmetic: the gateway imports it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

CONTINUITY_THRESHOLD_S = 0.1  # vLLM-Omni's default: the commonly cited audible-gap limit
# A wait this short is float noise in `arrival - end of the audio so far` (a chunk arriving
# exactly as the previous one ends), not a gap anyone hears.
_EPSILON_S = 1e-9


class AudioArrival(NamedTuple):
    """One audio chunk as it reached the listener: when (seconds, any one clock per request), how
    many samples, at which sample rate (chunks of one request may differ)."""

    time: float
    samples: int
    sample_rate: int


@dataclass(frozen=True)
class Listening:
    """What the listener heard of one request."""

    chunks: int  # non-empty audio chunks
    audio_s: float  # seconds of audio received
    stalls: int  # times the player waited with an empty buffer before the next chunk
    stall_s: float  # total time waited
    longest_stall_s: float  # the longest single wait
    continuity_ok: bool  # underrun_s <= the threshold it was judged with
    threshold_s: float

    @property
    def underrun_s(self) -> float:
        """vLLM-Omni's `audio_underrun` for this request (see the module docstring): equal to the
        total stall time of a player that waits for late audio."""
        return self.stall_s

    @property
    def heard(self) -> bool:
        """Any audio at all: a request without audio has nothing to stall."""
        return self.chunks > 0


def listen(arrivals: Iterable[AudioArrival], threshold_s: float = CONTINUITY_THRESHOLD_S) -> Listening:
    """Play `arrivals` (in arrival order) to a real-time listener and return its stalls.

    The player starts at the first non-empty chunk's arrival; each chunk plays for
    samples / sample_rate seconds right after the previous one, or on its arrival if the previous
    audio had already ended (a stall of arrival - end). No audio at all: no stall, continuity OK.
    """
    if threshold_s < 0:
        raise ValueError(f"the continuity threshold must be >= 0, not {threshold_s}")
    chunks = stalls = 0
    audio_s = stall_s = longest = 0.0
    end: float | None = None  # when the audio received so far has finished playing
    for time, samples, rate in arrivals:
        if samples < 0:
            raise ValueError(f"an audio chunk cannot have {samples} samples")
        if samples == 0:
            continue
        if rate <= 0:
            raise ValueError(f"an audio chunk's sample rate must be > 0, not {rate}")
        duration = samples / rate
        chunks += 1
        audio_s += duration
        if end is None:
            end = time + duration
            continue
        wait = time - end
        if wait > _EPSILON_S:
            stalls += 1
            stall_s += wait
            longest = max(longest, wait)
            end = time + duration
        else:
            end += duration
    return Listening(
        chunks=chunks,
        audio_s=audio_s,
        stalls=stalls,
        stall_s=stall_s,
        longest_stall_s=longest,
        continuity_ok=stall_s <= threshold_s,
        threshold_s=threshold_s,
    )
