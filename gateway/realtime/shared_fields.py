"""The settings session.update and response.create share (instructions, modalities, voice, output
tokens, temperature, output format), read in either naming scheme (GA or beta) onto a session's
configuration (gateway/realtime/session_config.py) or one response's settings
(gateway/realtime/turn.py): one reading, so a session and a response take a setting alike.
"""

from __future__ import annotations

from typing import Any

from gateway.api.openai.voices import known
from gateway.realtime.events import EventError
from gateway.realtime.formats import FORMATS, AudioFormat
from gateway.realtime.settings import ResponseFields, SessionFields, VoiceRef

Fields = SessionFields | ResponseFields  # what session.update and response.create carry


def _tokens(value: int | str | None) -> int | None:
    """A token cap as given (a number, or `inf`) as the request takes it: None for no cap."""
    return None if value in (None, "inf") else int(value)


def given_voice(fields: Fields, where: str) -> tuple[str, str] | None:
    """(the voice a session.update's or response.create's `fields` ask for, its param), or None."""
    output = fields.audio.output if fields.audio else None
    if output is not None and output.voice is not None:
        voice = output.voice
        return (voice.id if isinstance(voice, VoiceRef) else voice), f"{where}.audio.output.voice"
    if fields.voice is not None:
        return fields.voice, f"{where}.voice"
    return None


def given_format(fields: Fields, side: str) -> AudioFormat | None:
    """The wire format a session.update's or response.create's `fields` ask for on `side` (`input`
    or `output`), GA (`audio.<side>.format`) or beta (`<side>_audio_format`); None: not given."""
    config = getattr(fields.audio, side, None) if fields.audio else None
    if config is not None and config.format is not None:
        return FORMATS[config.format.type]
    beta = getattr(fields, f"{side}_audio_format", None)
    return FORMATS[beta] if beta is not None else None


def voice_error(fields: Fields, where: str, voices: tuple[str, ...] | None) -> EventError | None:
    """The refusal of a voice the deployment cannot speak (its own voices and OpenAI's names can
    be: gateway/api/openai/voices.py), or None."""
    given = given_voice(fields, where)
    if given is None or known(given[0], voices):
        return None
    voice, param = given
    return EventError(
        f"unknown voice {voice!r}; choose from {list(voices or ())} or one of OpenAI's voices",
        code="invalid_value",
        param=param,
    )


def apply_shared_fields(target: Any, fields: Fields, voice: bool = True) -> None:
    """The fields session.update and response.create share, in either naming scheme (GA or beta),
    onto a session config or one response's settings: only the fields given change (the voice
    only with `voice`: the caller refused it otherwise)."""
    if fields.instructions is not None:
        target.instructions = fields.instructions
    modalities = fields.output_modalities or fields.modalities
    if modalities is not None:
        target.output_modalities = list(dict.fromkeys(modalities))
    given = given_voice(fields, "")
    if given is not None and voice:
        target.voice = given[0]
    tokens = (
        fields.max_output_tokens
        if fields.max_output_tokens is not None
        else fields.max_response_output_tokens
    )
    if tokens is not None:
        target.max_output_tokens = _tokens(tokens)
    if fields.temperature is not None:
        target.temperature = fields.temperature
    output_format = given_format(fields, "output")
    if output_format is not None:
        target.output_format = output_format
