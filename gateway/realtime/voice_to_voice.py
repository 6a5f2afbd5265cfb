"""Voice-to-voice: what a person talking to the assistant feels, from the end of their own speech
to the first sound of the answer. Measured per response, from the end of the user's speech as the
turn detector located it (the arrival of the append that held it, gateway/realtime/input_buffer.py)
to the moment the response hands its first audio delta to the socket's writer.

A committed user audio turn carries its `SpokenTurn` (gateway/realtime/input_audio.py); the
response started right after it, for it (gateway/realtime/responder.py), takes it; a response made
for anything else (a tool's result, a text item, a second response to the same turn) has none and
measures nothing. Every time here is `time.monotonic()`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gateway.serving.metrics import GatewayMetrics

CLIENT_COMMIT = "none"  # the label of a turn the client's input_audio_buffer.commit decided


@dataclass(frozen=True)
class SpokenTurn:
    """How a user audio turn ended: `detection` is what decided it (server_vad, semantic_vad; none:
    the client committed), `speech_ended_at` when the last of its speech had arrived (the append that
    held the end the detector found, or the buffer's last append for a commit), `decided_at` when
    the turn was decided (the VAD's speech_stopped, or the commit)."""

    detection: str
    speech_ended_at: float
    decided_at: float

    def decided_perf(self) -> float:
        """`decided_at` on time.perf_counter()'s clock (the gateway sessions' timings)."""
        return time.perf_counter() - (time.monotonic() - self.decided_at)


class Traced(Protocol):
    """The response's request span (gateway/serving/tracing.py `RequestSpan`)."""

    def note(self, attributes: Mapping[str, Any]) -> None: ...


def first_audio(
    turn: SpokenTurn, metrics: GatewayMetrics, span: Traced | None, now: float | None = None
) -> float:
    """The answer to `turn` sends its first audio (at `now`): its voice-to-voice, in seconds, into
    the histogram and onto the span (with the detector's own share: decision - end of speech)."""
    now = time.monotonic() if now is None else now
    seconds = now - turn.speech_ended_at
    metrics.voice_to_voice.labels(turn_detection=turn.detection).observe(seconds)
    if span is not None:
        span.note(
            {
                "omnistream.realtime.voice_to_voice": seconds,
                "omnistream.realtime.turn_detection": turn.detection,
                "omnistream.realtime.turn_detection_latency": turn.decided_at - turn.speech_ended_at,
            }
        )
    return seconds
