"""A finished transcript in each of OpenAI's `response_format`s for `POST /v1/audio/transcriptions`
(openai-python's `Transcription` for json, `TranscriptionVerbose` for verbose_json, strings for
text, srt and vtt).

The model gives no timestamps, so verbose_json, srt and vtt hold the transcript as one segment
spanning the whole audio (0 to its duration, in milliseconds); a transcript with no words has no
segment (an empty srt, a vtt of its header only). A segment's fields that Whisper measures and this
model does not are given neutral values: `avg_logprob` and `no_speech_prob` 0, `tokens` empty,
`temperature` 0 (the transcription is greedy); `compression_ratio` is computed from the text as
Whisper does (its UTF-8 size over its zlib-compressed size).
"""

from __future__ import annotations

import zlib
from typing import Any, Literal

from gateway.serving.transcription import LANGUAGES, Transcript

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]
RESPONSE_FORMATS: tuple[ResponseFormat, ...] = ("json", "text", "srt", "verbose_json", "vtt")
JSON_FORMATS = frozenset({"json", "verbose_json"})
TEXT_MEDIA_TYPE = "text/plain; charset=utf-8"  # text, srt and vtt, as OpenAI answers them


def timestamp(seconds: float, separator: str) -> str:
    """`HH:MM:SS<separator>mmm`, rounded to the millisecond: srt's separator is ",", vtt's "."."""
    millis = max(0, round(seconds * 1000))
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{millis:03d}"


def language_name(code: str | None) -> str:
    """verbose_json's `language` as Whisper writes it (the lower-case English name) for the
    model's languages, another ISO code as given, "unknown" when none was given (the model does not
    say which language it heard)."""
    if not code:
        return "unknown"
    name = LANGUAGES.get(code)
    return name.lower() if name else code


def compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def segments(text: str, seconds: float) -> list[dict[str, Any]]:
    """The transcript as one segment from 0 to the audio's end (none when it has no words)."""
    if not text.strip():
        return []
    return [
        {
            "id": 0,
            "seek": 0,
            "start": 0.0,
            "end": round(seconds, 3),
            "text": text,
            "tokens": [],
            "temperature": 0.0,
            "avg_logprob": 0.0,
            "compression_ratio": compression_ratio(text),
            "no_speech_prob": 0.0,
        }
    ]


def cue_text(text: str) -> str:
    """A cue's text: its lines without blank ones (a blank line would end the cue)."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def vtt_escaped(text: str) -> str:
    """WebVTT cue text is markup: `&`, `<` and `>` are written as character references (which also
    keeps a `-->` in the text from reading as a timing line)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def srt(text: str, seconds: float) -> str:
    return "".join(
        f"{i}\n{timestamp(s['start'], ',')} --> {timestamp(s['end'], ',')}\n{cue_text(s['text'])}\n\n"
        for i, s in enumerate(segments(text, seconds), 1)
    )


def vtt(text: str, seconds: float) -> str:
    cues = "".join(
        f"{timestamp(s['start'], '.')} --> {timestamp(s['end'], '.')}\n{vtt_escaped(cue_text(s['text']))}\n\n"
        for s in segments(text, seconds)
    )
    return "WEBVTT\n\n" + cues


def token_usage(transcript: Transcript) -> dict[str, Any]:
    """The tokens the thinker counted, as `transcript.text.done`'s usage (the only kind its schema
    has); json's usage is the transcript's own (`Transcript.usage`), verbose_json's its seconds."""
    return {
        "type": "tokens",
        "input_tokens": transcript.input_tokens,
        "output_tokens": transcript.output_tokens,
        "total_tokens": transcript.input_tokens + transcript.output_tokens,
    }


def rendered(fmt: ResponseFormat, transcript: Transcript, seconds: float, language: str | None) -> Any:
    """The response body: a JSON object for json and verbose_json, a string for the others."""
    if fmt == "json":
        return {"text": transcript.text, "usage": transcript.usage()}
    if fmt == "verbose_json":
        return {
            "task": "transcribe",
            "language": language_name(language),
            "duration": round(seconds, 3),
            "text": transcript.text,
            "segments": segments(transcript.text, seconds),
            "usage": {"type": "duration", "seconds": round(seconds, 3)},
        }
    if fmt == "srt":
        return srt(transcript.text, seconds)
    if fmt == "vtt":
        return vtt(transcript.text, seconds)
    return transcript.text + "\n"  # text: as OpenAI's, ending with a line break
