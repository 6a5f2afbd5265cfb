"""What a client receives: typed events, and the whole answer once a stream is read to its end."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from omnistream.audio.wav import write_float32_wav


@dataclass(frozen=True)
class TextDelta:
    """More text; concatenating every `text` gives the answer's text."""

    text: str
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, eq=False)
class AudioChunk:
    """More speech: mono float32 samples in [-1, 1] at `sample_rate`, starting at `first_sample`."""

    samples: np.ndarray
    sample_rate: int
    first_sample: int


@dataclass(frozen=True)
class Usage:
    """Accounting and the server's timings (seconds from when the gateway admitted the request)."""

    prompt_tokens: int
    completion_tokens: int
    audio_frames: int = 0
    audio_samples: int = 0
    ttft: float | None = None
    ttfp: float | None = None
    e2e: float | None = None


@dataclass(frozen=True)
class End:
    """The answer is complete: "stop" (end of sequence) or "length" (max_tokens reached)."""

    finish_reason: str


Event = TextDelta | AudioChunk | Usage | End


@dataclass
class Result:
    """A whole answer, collected from its events (`Client.complete`, `AsyncClient.complete`)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    chunks: list[AudioChunk] = field(default_factory=list)
    usage: Usage | None = None
    finish_reason: str | None = None

    def add(self, event: Event) -> None:
        if isinstance(event, TextDelta):
            self.text += event.text
            self.token_ids.extend(event.token_ids)
        elif isinstance(event, AudioChunk):
            self.chunks.append(event)
        elif isinstance(event, Usage):
            self.usage = event
        elif isinstance(event, End):
            self.finish_reason = event.finish_reason

    @property
    def audio(self) -> np.ndarray:
        if not self.chunks:
            return np.zeros(0, np.float32)
        return np.concatenate([c.samples for c in self.chunks]).astype(np.float32, copy=False)

    @property
    def sample_rate(self) -> int | None:
        return self.chunks[0].sample_rate if self.chunks else None

    def write_wav(self, path: str | Path) -> None:
        """The speech as a 32-bit float WAV (the samples exactly as received)."""
        write_float32_wav(path, self.audio, self.sample_rate or 24000)
