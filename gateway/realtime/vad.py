"""Server VAD: WebRTC's voice activity detector (webrtcvad-wheels) on 20 ms frames.

Why webrtcvad: a maintained, tested detector (GMM over sub-band energies, made for telephony) that
tells speech from steady noise far better than an energy threshold, in C and about 10 us a frame,
torch-free as the gateway must stay (silero would pull torch or onnxruntime).

It takes 8/16/32/48 kHz; the Realtime API's 24 kHz input is doubled to 48 kHz by repeating each
sample (exact in length, and the detector low-passes to 8 kHz internally, so the images above
12 kHz that repeating creates do not reach it).

OpenAI's `threshold` (0..1, higher = needs louder/clearer speech) maps to the detector's
aggressiveness 0..3. A turn starts when 3 of the last 5 frames (100 ms) are voiced, at the first
voiced frame of those; it ends after `silence_duration_ms` of unvoiced frames, at the end of the
last voiced one. Positions are in samples of the session's input stream (24 kHz).

OpenAI's `semantic_vad` decides with a model whether the user has finished (no such model can be
had here), waiting longer for a low `eagerness` (up to 8 s, 4 s, 2 s for low, medium, high). This
detector serves it with a silence window per eagerness instead (`SEMANTIC_SILENCE_MS`): `high`
answers soonest (400 ms, shorter than server_vad's default 500 ms), `medium`/`auto` (the default)
lets a speaker pause for breath (800 ms), `low` lets them pause mid-thought (1.5 s). Longer windows
than these would make every turn that much slower, since silence alone cannot tell a finished
sentence from a pause.

Between the two, a pause: once a turn's silence has lasted `pause_ms` (its window less the
gateway's speculation lead), the detector says so (`paused`, at the same end as the `stopped` that
follows unless speech resumes first, `resumed`), so the answer can be prepared during the rest of
the silence (gateway/realtime/speculation.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import webrtcvad  # type: ignore[import-untyped]  # the package ships no stubs nor py.typed

INPUT_RATE = 24000
FRAME_MS = 20
FRAME_SAMPLES = INPUT_RATE * FRAME_MS // 1000  # 480
FRAME_BYTES = FRAME_SAMPLES * 2
START_WINDOW = 5  # frames looked at for a start
START_VOICED = 3  # voiced frames among them that start a turn
SEMANTIC_SILENCE_MS = {"high": 400, "medium": 800, "auto": 800, "low": 1500}


def aggressiveness(threshold: float) -> int:
    """OpenAI's threshold 0..1 -> webrtcvad mode 0..3 (0.5, the default, is mode 2)."""
    return min(3, max(0, int(threshold * 4)))


@dataclass(frozen=True)
class VadEvent:
    kind: str  # "started" | "paused" | "resumed" | "stopped"
    sample: int  # where speech started / ended / resumed, in input samples since the session began


class SpeechDetector:
    def __init__(
        self, threshold: float = 0.5, silence_duration_ms: int = 500, pause_ms: int | None = None
    ) -> None:
        """`pause_ms`: the silence after which a turn is reported `paused` (None, or not shorter
        than the window: never)."""
        self._vad = webrtcvad.Vad(aggressiveness(threshold))
        self.silence_duration_ms = silence_duration_ms
        self._silence_frames = max(1, -(-silence_duration_ms // FRAME_MS))
        pause = None if pause_ms is None else max(1, -(-pause_ms // FRAME_MS))
        self._pause_frames = pause if pause is not None and pause < self._silence_frames else None
        self.paused = False  # `paused` was reported in this silence
        self._pending = b""
        self.position = 0  # samples consumed (whole frames)
        self.in_speech = False
        self._window: deque[tuple[int, bool]] = deque(maxlen=START_WINDOW)
        self._silence = 0
        self._last_voiced_end = 0

    def _voiced(self, frame: bytes) -> bool:
        samples = np.frombuffer(frame, dtype="<i2")
        return bool(self._vad.is_speech(np.repeat(samples, 2).tobytes(), INPUT_RATE * 2))

    def process(self, pcm: bytes) -> list[VadEvent]:
        """Feed pcm16 24 kHz bytes; the turn starts and ends found in them, in order."""
        data = self._pending + pcm
        whole = len(data) - len(data) % FRAME_BYTES
        self._pending = data[whole:]
        events: list[VadEvent] = []
        for offset in range(0, whole, FRAME_BYTES):
            start = self.position
            voiced = self._voiced(data[offset : offset + FRAME_BYTES])
            self.position += FRAME_SAMPLES
            if voiced:
                self._last_voiced_end = self.position
            if not self.in_speech:
                self._window.append((start, voiced))
                flags = [v for _, v in self._window]
                if sum(flags) >= START_VOICED:
                    first = next(s for s, v in self._window if v)
                    self.in_speech = True
                    self._silence = 0
                    self._window.clear()
                    events.append(VadEvent("started", first))
            elif voiced:
                self._silence = 0
                if self.paused:
                    self.paused = False
                    events.append(VadEvent("resumed", start))
            else:
                self._silence += 1
                if self._silence >= self._silence_frames:
                    self.in_speech = self.paused = False
                    self._silence = 0
                    events.append(VadEvent("stopped", self._last_voiced_end))
                elif self._silence == self._pause_frames:
                    self.paused = True
                    events.append(VadEvent("paused", self._last_voiced_end))
        return events

    def reset(self) -> None:
        """Forget a turn in progress (the buffer was cleared or committed by the client)."""
        self.in_speech = self.paused = False
        self._silence = 0
        self._window.clear()
