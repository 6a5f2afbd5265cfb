"""A turn's audio encoded while it is still spoken (ThinkerParams.encode_only).

The thinker's audio encoder attends within windows (`n_window_infer` mel frames: 8 s on
Qwen3-Omni), so a window's rows are final once its audio is. Each time the turn's audio has grown by
`realtime_work_ahead_ms` (2 s by default: a window on the tiny checkpoints, a quarter of one on the
real model), the audio so far goes to the thinker as work ahead: it encodes the whole
windows whose frames are final and keeps their rows in the session's cache scope
(omnistream/models/qwen3_omni/thinker/encoded_windows.py). The committed turn's request finds them
by their features, so what is left to encode at the commit is at most the last window, whatever the
turn's length; a window whose features came out differently is encoded again, so the answer is
always the one it would have been.

The audio sent is the turn's audio as it is resampled while it arrives (gateway/realtime/
turn_resampler.py `settled`): what the commit's decode will begin with, sample for sample. At most
one is in flight per session, none is sent once the server VAD has heard the pause that starts the
speculation (which encodes what is left itself), and a commit cancels the one in flight; one that
fails or is refused (a full gateway) only leaves the commit its whole work.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging

import numpy as np

from gateway.realtime.audio import WAV_HEADER
from gateway.serving.core import GatewayCore
from gateway.serving.tracing import Incoming
from omnistream.request.defaults import RequestInput, ServingDefaults, resolve
from omnistream.request.errors import OmniError
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import AudioInput

log = logging.getLogger(__name__)

# Fewer 16 kHz samples than this are not worth a request (under a window on any checkpoint).
MIN_SAMPLES = 256
SPAN = Incoming("realtime work ahead", face="websocket")


class WorkAhead:
    """One session's work ahead: on each append, `send` the turn's audio so far when `due`."""

    def __init__(self, core: GatewayCore, cache_scope: bytes, every_bytes: int) -> None:
        self.core = core
        self.cache_scope = cache_scope
        self.every_bytes = every_bytes  # pcm16 bytes of new audio between sends (0: off)
        self._sent = 0  # bytes of the current turn's audio the last send held
        self._task: asyncio.Task[None] | None = None

    def restart(self) -> None:
        """The turn's audio starts anew (a commit, a clear, a new turn's start): one in flight is
        cancelled, its work now the commit's own (or of audio no request will hold)."""
        self._sent = 0
        if self._task is not None:
            self._task.cancel()

    def due(self, length: int) -> bool:
        """Is a turn's audio of `length` pcm16 bytes to be sent now?"""
        if self.every_bytes <= 0 or length - self._sent < self.every_bytes:
            return False
        return self._task is None or self._task.done()

    def send(self, length: int, samples: np.ndarray) -> None:
        """The turn's audio so far (`length` pcm16 bytes, `due`), from the sample its item will
        start at: `samples`, the part of it resampled for the thinker that is final."""
        modalities = self.core.deployment.input_modalities
        if modalities is not None and "audio" not in modalities:
            return
        self._sent = length
        if samples.size < MIN_SAMPLES:
            return
        self._task = asyncio.create_task(self._run(length, samples), name="realtime work ahead")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self, length: int, samples: np.ndarray) -> None:
        outcome = "failed"
        try:
            # Past the media limits the commit will refuse the turn: nothing to work ahead for.
            self.core.media.check_audio(WAV_HEADER + length, samples.size, "input_audio_buffer")
            session = await self.core.open(self._request(samples), trace=SPAN)
            try:
                async for _ in session.events():
                    pass
            finally:
                await session.aclose()
            outcome = "done"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except OmniError as exc:
            log.debug("realtime work ahead not done: %s", exc)
        except Exception:  # a bug: the commit still encodes what this would have
            log.exception("realtime work ahead failed")
        finally:
            self.core.metrics.work_ahead.labels(outcome=outcome).inc()

    def _request(self, samples: np.ndarray) -> GenerationRequest:
        exact = AudioInput(samples)
        known = self.core.deployment
        given = RequestInput(
            messages=[{"role": "user", "content": [{"type": "audio", "audio": exact}]}],
            max_tokens=1,
            temperature=0.0,
            return_audio=False,
        )
        request = resolve(given, ServingDefaults.of(self.core.config, known.voices, known.default_voice))
        return dataclasses.replace(request, cache_scope=self.cache_scope, encode_only=True)
