"""A transcription of someone's speech, made by the thinker itself (Qwen3-Omni transcribes speech:
its model card's ASR prompt, "Transcribe the <language> audio into text."), for the realtime
input transcription and `POST /v1/audio/transcriptions` alike.

It runs as background work (GenerationRequest.background): text only, greedy, and stepped by the
thinker only when none of its other requests can step, so a transcription never makes a spoken
answer wait (it waits for them instead). OpenAI's transcription model names all name this one
model: there is no second model to pick.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from gateway.serving.core import GatewayCore
from gateway.serving.tracing import Incoming
from omnistream.request.defaults import RequestInput, ServingDefaults, resolve
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import DoneEvent, GenerationRequest, TextEvent

# The speech input languages of Qwen3-Omni's model card, by their ISO-639 code (OpenAI's
# `language`): named in the prompt. Another code is accepted and left out of the prompt (the
# model then finds the language itself).
LANGUAGES = {
    "en": "English",
    "zh": "Chinese",
    "ko": "Korean",
    "ja": "Japanese",
    "de": "German",
    "ru": "Russian",
    "it": "Italian",
    "fr": "French",
    "es": "Spanish",
    "pt": "Portuguese",
    "ms": "Malay",
    "nl": "Dutch",
    "id": "Indonesian",
    "tr": "Turkish",
    "vi": "Vietnamese",
    "yue": "Cantonese",
    "ar": "Arabic",
    "ur": "Urdu",
}
# A transcript's token budget: generous for speech (people say ~3 words a second) plus a floor,
# so a short utterance is never cut and noise cannot run on for long.
TOKENS_PER_SECOND = 12
MIN_TOKENS = 32
MAX_PROMPT = 4_000  # characters of the `prompt` (context) a transcription takes


def check_language(language: str | None, field: str = "language") -> str | None:
    """`language` as an ISO-639 code (2 or 3 lower-case letters), or InvalidRequest naming `field`."""
    if language is None or language == "":
        return None
    if not (2 <= len(language) <= 3 and language.isascii() and language.isalpha() and language.islower()):
        raise InvalidRequest(
            f"language must be an ISO-639 code such as 'en' (got {language[:16]!r})", field=field
        )
    return language


def instruction(language: str | None, prompt: str | None) -> str:
    """What the thinker is asked: the model card's ASR prompt, the language named when it is one of
    the model's, and the caller's `prompt` (words or the text before, OpenAI's meaning) as context."""
    name = LANGUAGES.get(language or "")
    ask = f"Transcribe the {name} audio into text." if name else "Transcribe the audio into text."
    if prompt:
        ask += f" Context (for spelling and style, not to be transcribed): {prompt[:MAX_PROMPT]}"
    return ask


def transcription_request(
    audio: dict[str, Any],
    seconds: float,
    deployment: ServingDefaults,
    language: str | None = None,
    prompt: str | None = None,
) -> GenerationRequest:
    """The thinker's request for one audio part (`{"type": "audio", "audio": AudioInput}`, already
    decoded) of `seconds`: a user turn of the audio and the instruction, greedy, text only, in the
    background."""
    budget = MIN_TOKENS + math.ceil(seconds * TOKENS_PER_SECOND)
    content = [audio, {"type": "text", "text": instruction(language, prompt)}]
    given = RequestInput(
        messages=[{"role": "user", "content": content}],
        max_tokens=min(budget, deployment.max_tokens),
        temperature=0.0,
        return_audio=False,
    )
    return dataclasses.replace(resolve(given, deployment), background=True)


@dataclass
class Transcript:
    """A finished transcription: its text, the seconds of audio it heard and what the thinker
    counted."""

    text: str
    seconds: float
    input_tokens: int
    output_tokens: int
    finish_reason: str

    def usage(self) -> dict[str, Any]:
        """OpenAI's usage of a transcription, by the audio's duration (whisper-1's kind): exact
        here, where a split of the prompt's tokens into audio and text (what the token kind must
        give, and the Node Agents SDK requires) would be an estimate."""
        return {"type": "duration", "seconds": round(self.seconds, 3)}


class Transcription:
    """One running transcription: `deltas()` streams its text; `transcript` is set once it ended."""

    def __init__(
        self, core: GatewayCore, request: GenerationRequest, seconds: float, trace: Incoming | None = None
    ) -> None:
        self.core = core
        self.request = request
        self.seconds = seconds  # of the audio (the usage)
        self.trace = trace
        self.transcript: Transcript | None = None

    async def deltas(self) -> AsyncGenerator[str, None]:
        """The text as the thinker makes it; an OmniError if it is refused or fails. A caller that
        stops reading closes it (`aclose()`): that ends the thinker request."""
        session = await self.core.open(self.request, trace=self.trace)
        text: list[str] = []
        try:
            async with contextlib.aclosing(session.events()) as events:
                async for event in events:
                    if isinstance(event, TextEvent) and event.delta:
                        text.append(event.delta)
                        yield event.delta
                    elif isinstance(event, DoneEvent):
                        self.transcript = Transcript(
                            "".join(text),
                            self.seconds,
                            len(event.prompt_ids),
                            len(event.output_ids),
                            event.finish_reason,
                        )
        finally:
            await session.aclose()

    async def run(self) -> Transcript:
        """The whole transcript (no deltas)."""
        async for _ in self.deltas():
            pass
        assert self.transcript is not None, "the stream ended without its summary"
        return self.transcript
