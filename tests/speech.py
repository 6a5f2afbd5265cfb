"""Spoken test input (espeak-ng, pcm16 24 kHz), cached under the repository's .cache/speech."""

from __future__ import annotations

from pathlib import Path

from omnistream.bench import speech
from omnistream.bench.speech import RATE, pieces, silence_pcm16

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "speech"

__all__ = ["RATE", "pieces", "silence_pcm16", "speech_pcm16"]


def speech_pcm16(text: str, voice: str = "en") -> bytes:
    return speech.speech_pcm16(text, voice, CACHE)
