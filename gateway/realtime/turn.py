"""A response's request: the session's instructions as the system message, then the conversation's
items (the history, kept by the gateway so a client never re-sends it, as much as the context holds:
gateway/realtime/context.py) as chat messages.

User items keep their media (audio as the decoded 16 kHz samples, images as decoded pixels), so the
thinker hears earlier turns, not a transcript it never made; assistant items are their text. System
items join the instructions (one system message, as the chat template expects). Function calls and
their results are the template's tool turns (gateway/realtime/function_calls.py); the session's
tools (or the response's) are in the prompt, and `required` or a named function is the answer's
grammar (gateway/tools/spec.py).
Defaults come from the one table (`omnistream.request.defaults.resolve`), as for REST and gRPC.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from gateway.api.openai.voices import speaker_for
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.formats import PCM16, AudioFormat
from gateway.realtime.function_calls import joined, prompt_message
from gateway.realtime.protocol import new_id
from gateway.realtime.session_config import SessionConfig
from gateway.realtime.settings import ResponseFields
from gateway.realtime.shared_fields import apply_shared_fields, voice_error
from gateway.realtime.tool_config import apply_tools, checked_use
from gateway.tools.spec import Choice, Function, Named, ToolUse
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
    tools: tuple[Function, ...] = ()
    tool_choice: Choice | Named = "auto"
    tools_from: str = "session"  # where the tools and choice were set: `session` or `response`
    output_format: AudioFormat = PCM16

    @property
    def speaks(self) -> bool:
        return "audio" in self.output_modalities

    @property
    def tool_use(self) -> ToolUse:
        """What the answer does with its tools; an EventError naming `session.tool_choice` (or
        `response.tool_choice`) when the choice does not fit the tools (tool_config.py)."""
        return checked_use(self.tools, self.tool_choice, self.tools_from)

    @classmethod
    def of(
        cls, config: SessionConfig, fields: ResponseFields | None, voices: tuple[str, ...] | None = None
    ) -> ResponseSettings:
        """The session's settings with response.create's; what it gives is checked (an EventError
        naming a bad tool or a voice the deployment cannot speak)."""
        settings = cls(
            config.instructions,
            list(config.output_modalities),
            config.voice,
            config.max_output_tokens,
            config.temperature,
            config.tools,
            config.tool_choice,
            output_format=config.output_format,
        )
        if fields is None:
            return settings
        bad_voice = voice_error(fields, "response", voices)
        if bad_voice is not None:
            raise bad_voice
        apply_tools(settings, fields, "response")
        if fields.tools is not None or fields.tool_choice is not None:
            settings.tools_from = "response"
        apply_shared_fields(settings, fields)
        return settings


def answer_item(settings: ResponseSettings) -> Item:
    """A response's own item, in the conversation (and its caps) from the response's start."""
    kind = "output_audio" if settings.speaks else "output_text"
    return Item(new_id("item"), "assistant", [], [{"type": kind}], status="in_progress")


def message_of(item: Item) -> dict[str, Any] | None:
    """The chat message `item` is in a prompt; None for one that is not a message of its own (a
    system item joins the system message; an answer being made, or cut before a word, is left out)."""
    if item.status == "in_progress" or item.role == "system":
        return None
    if item.type != "message":
        return prompt_message(item)
    if item.role == "assistant":
        return {"role": "assistant", "content": item.text} if item.text else None
    return {"role": "user", "content": list(item.parts)} if item.parts else None


def system_text(conversation: Conversation, instructions: str | None) -> str:
    """The one system message: the instructions, then the system items' text ("": none)."""
    system = [instructions] if instructions else []
    for item in conversation.items.values():
        if item.role == "system" and item.status != "in_progress":
            system.extend(p["text"] for p in item.parts if p["type"] == "text")
    return "\n\n".join(system)


def messages_of(conversation: Conversation, instructions: str | None) -> list[dict[str, Any]]:
    system = system_text(conversation, instructions)
    turns: list[tuple[Item | None, dict[str, Any]]] = []
    if system:
        turns.append((None, {"role": "system", "content": system}))
    for item in conversation.items.values():
        message = message_of(item)
        if message is not None:
            turns.append((item, message))
    return joined(turns)


def build_request(
    conversation: Conversation,
    config: SessionConfig,
    settings: ResponseSettings,
    serving: ServingDefaults,
    cache_scope: bytes = b"",
) -> GenerationRequest:
    """The turn's request: the whole history as chat messages, in the session's cache scope."""
    ext = config.extensions
    messages = messages_of(conversation, settings.instructions)
    use = settings.tool_use
    asked = settings.voice
    request = resolve(
        RequestInput(
            messages=messages,
            max_tokens=settings.max_output_tokens,
            ignore_eos=ext.ignore_eos,
            temperature=settings.temperature,
            seed=ext.seed,
            return_audio=settings.speaks,
            voice=None if asked is None else speaker_for(asked, serving.voices, serving.voice),
            max_audio_frames=ext.max_audio_frames,
            tools=use.prompt_tools(),
            structured_output=use.structured_output,
        ),
        serving,
    )
    # The history's audio goes to the thinker once; later turns name it (gateway/serving/sent_audio.py).
    return dataclasses.replace(request, cache_scope=cache_scope, refer_audio=bool(cache_scope))
