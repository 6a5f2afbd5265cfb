"""One realtime connection's configuration: what session.update set (GA or beta fields, a setting
that cannot be served refused alone), and the session object session.created and
session.updated show it as, in the connection's scheme.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.realtime.events import EventError
from gateway.realtime.formats import PCM16, AudioFormat
from gateway.realtime.protocol import Protocol
from gateway.realtime.settings import Extensions, InputTranscription, SessionFields, TurnDetection
from gateway.realtime.shared_fields import apply_shared_fields, given_format, voice_error
from gateway.realtime.tool_config import apply_tools, choice_wire, tools_wire
from gateway.tools.spec import Choice, Function, Named


@dataclass
class SessionConfig:
    instructions: str | None = None
    voice: str | None = None  # as asked (None: the deployment's default voice)
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    max_output_tokens: int | None = None
    temperature: float | None = None
    extensions: Extensions = field(default_factory=Extensions)
    tools: tuple[Function, ...] = ()
    tool_choice: Choice | Named = "auto"
    input_format: AudioFormat = PCM16
    output_format: AudioFormat = PCM16
    transcription: InputTranscription | None = None  # None: the user's audio is not transcribed

    def apply(self, update: SessionFields, voices: tuple[str, ...] | None = None) -> list[EventError]:
        """Apply a session.update (GA or beta fields); only the fields it names change. A setting
        that cannot be served (a bad tool, a voice the deployment cannot speak) is refused alone:
        returned, naming it, while the rest applies."""
        refused: list[EventError] = []
        try:
            apply_tools(self, update, "session")
        except EventError as exc:
            refused.append(exc)
        bad_voice = voice_error(update, "session", voices)
        if bad_voice is not None:
            refused.append(bad_voice)
        apply_shared_fields(self, update, voice=bad_voice is None)
        given, detection = update.turn_detection_given()
        if given:
            self.turn_detection = detection
        given, transcription = update.transcription_given()
        if given:
            self.transcription = transcription
        if update.omnistream is not None:
            self.extensions = update.omnistream
        self.input_format = given_format(update, "input") or self.input_format
        return refused

    @property
    def speaks(self) -> bool:
        return "audio" in self.output_modalities

    def describe(
        self, protocol: Protocol, session_id: str, model: str, voice: str, speaker: str
    ) -> dict[str, Any]:
        """The session object of session.created / session.updated, in the connection's scheme:
        each setting as the client gave it (`voice`: as asked, or the default), and in `omnistream`
        what serves it where that differs from what OpenAI would do (`speaker`: the model's voice
        that speaks; the server VAD that serves the turn detection)."""
        td = self.turn_detection
        detection = None if td is None else td.wire()
        served = {"voice": speaker, "turn_detection": None if td is None else td.served().wire()}
        tokens: int | str = self.max_output_tokens or "inf"
        tool_choice = choice_wire(self.tool_choice, protocol.beta)
        if protocol.beta:  # no `model`: beta's schema takes only OpenAI's model names there
            return {
                "id": session_id,
                "object": "realtime.session",
                "modalities": self.output_modalities,
                "instructions": self.instructions or "",
                "voice": voice,
                "input_audio_format": self.input_format.beta,
                "output_audio_format": self.output_format.beta,
                "turn_detection": detection,
                "input_audio_transcription": self._transcription(beta=True),
                "temperature": self.temperature,
                "max_response_output_tokens": tokens,
                "tools": tools_wire(self.tools),
                "tool_choice": tool_choice,
                "omnistream": served,
            }
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": model,
            "output_modalities": self.output_modalities,
            "instructions": self.instructions or "",
            "audio": {
                "input": {
                    "format": self.input_format.wire(),
                    "turn_detection": detection,
                    "transcription": self._transcription(beta=False),
                },
                "output": {"format": self.output_format.wire(), "voice": voice},
            },
            "max_output_tokens": tokens,
            "tools": tools_wire(self.tools),
            "tool_choice": tool_choice,
            "omnistream": served,
        }

    def _transcription(self, beta: bool) -> dict[str, Any] | None:
        return None if self.transcription is None else self.transcription.wire(beta)
