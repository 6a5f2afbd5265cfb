"""A response's request: the session's instructions as the system message, then the conversation's
items (the bounded history, kept by the gateway so a client never re-sends it) as chat messages.

User items keep their media (audio as the decoded 16 kHz samples, images as decoded pixels), so the
thinker hears earlier turns, not a transcript it never made; assistant items are their text. System
items join the instructions (one system message, as the chat template expects).
Defaults come from the one table (`omnistream.request.defaults.resolve`), as for REST and gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.realtime.events import ResponseFields
from gateway.realtime.session import Conversation, SessionConfig, apply_shared_fields
from omnistream.request.defaults import RequestInput, ServingDefaults, resolve
from omnistream.request.generation import GenerationRequest


@dataclass
class ResponseSettings:
    """What one response runs with: the session's config, overridden by response.create's fields."""

    instructions: str | None
    output_modalities: list[str]
    voice: str | None
    max_output_tokens: int | None
    temperature: float | None

    @property
    def speaks(self) -> bool:
        return "audio" in self.output_modalities

    @classmethod
    def of(cls, config: SessionConfig, fields: ResponseFields | None) -> ResponseSettings:
        settings = cls(
            config.instructions,
            list(config.output_modalities),
            config.voice,
            config.max_output_tokens,
            config.temperature,
        )
        if fields is not None:
            apply_shared_fields(settings, fields)
        return settings


def messages_of(conversation: Conversation, instructions: str | None) -> list[dict[str, Any]]:
    system = [instructions] if instructions else []
    messages: list[dict[str, Any]] = []
    for item in conversation.items.values():
        if item.status == "in_progress":
            continue
        if item.role == "system":
            system.extend(p["text"] for p in item.parts if p["type"] == "text")
        elif item.role == "assistant":
            if item.text:
                messages.append({"role": "assistant", "content": item.text})
        elif item.parts:
            messages.append({"role": "user", "content": list(item.parts)})
    if system:
        messages.insert(0, {"role": "system", "content": "\n\n".join(system)})
    return messages


def build_request(
    conversation: Conversation,
    config: SessionConfig,
    settings: ResponseSettings,
    serving: ServingDefaults,
) -> GenerationRequest:
    ext = config.extensions
    messages = messages_of(conversation, settings.instructions)
    return resolve(
        RequestInput(
            messages=messages,
            max_tokens=settings.max_output_tokens,
            ignore_eos=ext.ignore_eos,
            temperature=settings.temperature,
            seed=ext.seed,
            return_audio=settings.speaks,
            voice=settings.voice,
            max_audio_frames=ext.max_audio_frames,
        ),
        serving,
    )
