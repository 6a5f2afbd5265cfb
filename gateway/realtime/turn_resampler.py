"""A turn's audio resampled for the thinker as it arrives, so its commit resamples a constant tail.

The thinker takes 16 kHz float audio; the realtime buffer holds pcm16 at 24 kHz. A committed turn
used to go, whole, through the media decoder (a WAV through FFmpeg's resampler, in the decoder
threads): work that grows with the turn and, with several sessions ending turns at once, queued
behind the others' in the decoder pool. Here the buffer's audio goes through the same resampler at
each append, and a turn ending at stream sample `end` is made of:

- the streamed output whose inputs all lie well before `end` (FFmpeg's resampler gives the same
  samples however its input is cut into frames: a FIR filter with a phase that repeats every
  `STEP_IN` input samples), and
- the rest from a second resampler started `MARGIN` input samples before `end` at a phase-aligned
  sample, flushed at `end` as the one-shot decode flushes (FFmpeg pads the end by reflection), its
  first `SKIP` outputs (those its own start shaped) dropped.

The result is the media decoder's, sample for sample (tests/unit/gateway/realtime/
test_turn_resampler.py compares them over many ends and append sizes), at the cost of `MARGIN`
samples at the commit whatever the turn's length. Where the stream does not cover the turn (its
start moved, or nothing was streamed: a server-VAD buffer before speech starts slides, so it is
streamed only while a turn is open) the whole turn is resampled at once, as before.
"""

from __future__ import annotations

import math

import av
import numpy as np

from gateway.realtime.vad import INPUT_RATE
from omnistream.request.media import AUDIO_SAMPLE_RATE

# The resampler's phase repeats every STEP_IN input samples (STEP_OUT output samples).
_COMMON = math.gcd(INPUT_RATE, AUDIO_SAMPLE_RATE)
STEP_IN, STEP_OUT = INPUT_RATE // _COMMON, AUDIO_SAMPLE_RATE // _COMMON
# Input samples the tail's resampler starts before the end (its filter reaches ~50: measured).
MARGIN = 1200
# Its first outputs, shaped by its own start (half the margin: filter reach, with room).
SKIP = MARGIN // 2 // STEP_IN * STEP_OUT
# Input samples streamed at once (100 ms): a resampler call costs ~50 us however short its input,
# and a microphone's appends are 20 ms, 400 a second at 8 sessions; the output is the same.
STREAM_EVERY = 2400


def _resampler() -> av.AudioResampler:
    """The media decoder's (gateway/media/file_decode.py `_read_audio`): to float, 16 kHz."""
    return av.AudioResampler(format="fltp", rate=AUDIO_SAMPLE_RATE)


def _run(resampler: av.AudioResampler, pcm: bytes | None) -> list[np.ndarray]:
    """`pcm` (pcm16 24 kHz; None: flush) through `resampler`: its output as float32 arrays."""
    frame = None
    if pcm is not None:
        if not pcm:
            return []
        frame = av.AudioFrame.from_ndarray(
            np.frombuffer(pcm, "<i2").reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = INPUT_RATE
    return [out.to_ndarray()[0].astype(np.float32, copy=False) for out in resampler.resample(frame)]


def resample_whole(pcm: bytes) -> np.ndarray:
    """pcm16 24 kHz as the media decoder decodes its WAV: resampled, flushed, clipped."""
    resampler = _resampler()
    chunks = _run(resampler, pcm) + _run(resampler, None)
    samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return np.clip(samples, -1.0, 1.0)


class TurnResampler:
    """One session's input buffer resampled as it grows (`advance`); `turn` gives a turn's audio."""

    def __init__(self) -> None:
        self.origin = 0  # the stream sample the streamed input starts at
        self.fed = 0  # input samples streamed from `origin`
        self._resampler = _resampler()
        self._out: list[np.ndarray] = []
        self._made = 0  # output samples streamed

    def _restart(self, origin: int) -> None:
        self.origin, self.fed = origin, 0
        self._resampler = _resampler()
        self._out, self._made = [], 0

    def advance(self, start: int, data: bytes | bytearray) -> None:
        """Keep up with a buffer whose audio from stream sample `start` is `data` (pcm16 24 kHz):
        what is new is streamed, once there is `STREAM_EVERY` of it; a buffer that starts elsewhere
        now starts the stream anew."""
        if start != self.origin:
            self._restart(start)
        if len(data) // 2 - self.fed >= STREAM_EVERY:
            self._stream(bytes(data[self.fed * 2 :]))

    def _stream(self, pcm: bytes) -> None:
        for chunk in _run(self._resampler, pcm):
            self._out.append(chunk)
            self._made += chunk.size
        self.fed += len(pcm) // 2

    def settled(self) -> np.ndarray:
        """The streamed output that no later input can change (all but the filter's reach and
        the last appends, under `STREAM_EVERY`, not streamed yet)."""
        keep = max(0, self._made - SKIP)
        return self._streamed(keep)

    def _streamed(self, keep: int) -> np.ndarray:
        if len(self._out) > 1:
            self._out = [np.concatenate(self._out)]
        return np.clip(self._out[0][:keep], -1.0, 1.0) if self._out else np.zeros(0, np.float32)

    def turn(self, start: int, pcm: bytes) -> np.ndarray | None:
        """The turn whose audio from stream sample `start` is `pcm`, resampled as the media
        decoder resamples it whole (`resample_whole`, the same samples); None where the stream does
        not hold it (the caller resamples it whole, off the event loop: that grows with the turn)."""
        length = len(pcm) // 2
        if start != self.origin:
            return None
        if self.fed < length:
            self._stream(pcm[self.fed * 2 :])
        tail_from = (length - MARGIN) // STEP_IN * STEP_IN
        keep = tail_from // STEP_IN * STEP_OUT + SKIP
        if tail_from <= 0 or keep > self._made:
            return resample_whole(pcm)  # at most MARGIN samples
        tail = _resampler()
        rest = _run(tail, pcm[tail_from * 2 :]) + _run(tail, None)
        joined = np.concatenate(rest)[SKIP:] if rest else np.zeros(0, np.float32)
        return np.concatenate([self._streamed(keep), np.clip(joined, -1.0, 1.0)])
