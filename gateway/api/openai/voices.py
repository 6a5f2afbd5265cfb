"""OpenAI's voice names as the model's voices: the one table `/v1/realtime` and `/v1/audio/speech`
both use, so a client written for OpenAI (the Agents SDK asks for `ash`, most examples for `alloy`)
speaks without changing its voice, and gets the same voice through either door.

Why a table and not a refusal: OpenAI's schemas accept these names, and a refused voice drops the
whole setting it came in (an agent framework's session update); the nearest voice is what such a
client wants. The model's own names (`/v1/models`: chelsie, ethan, aiden for Qwen3-Omni) are
always taken as they are, and win over this table. Each OpenAI voice goes to the Qwen3-Omni voice
of its register: the women's voices to chelsie, the brighter men's to ethan (the deployment's
default, which `ash`, the Agents SDK's default, keeps), the deeper and calmer men's to aiden. A
deployment without that voice speaks its default voice instead (the model's, as its talker reports
it: `ServingDefaults.default_voice`).
"""

from __future__ import annotations

from collections.abc import Sequence

from omnistream.request.defaults import ServingDefaults

# OpenAI's published voices (the realtime schema's ten and the speech API's three more).
OPENAI_VOICES: dict[str, str] = {
    "alloy": "chelsie",
    "coral": "chelsie",
    "marin": "chelsie",
    "nova": "chelsie",
    "sage": "chelsie",
    "shimmer": "chelsie",
    "ash": "ethan",
    "fable": "ethan",
    "verse": "ethan",
    "ballad": "aiden",
    "cedar": "aiden",
    "echo": "aiden",
    "onyx": "aiden",
}


def _has(voices: Sequence[str], name: str) -> bool:
    return name.lower() in (v.lower() for v in voices)


def speaker_for(asked: str, voices: Sequence[str] | None, default_voice: str | None = None) -> str:
    """The model's voice that speaks for `asked`: itself when the deployment has it (or its voices
    are not known yet) and it is no OpenAI name, the table's voice for an OpenAI name (the
    deployment's `default_voice` when it lacks that one; "" when that is not known either: the
    talker's default); any other name is returned as it is, for the talker's voice check to refuse."""
    if voices and _has(voices, asked):
        return asked
    target = OPENAI_VOICES.get(asked.lower())
    if target is None:
        return asked
    if voices and not _has(voices, target):
        return ServingDefaults(voices=tuple(voices), voice=default_voice).default_voice()
    return target


def known(asked: str, voices: Sequence[str] | None) -> bool:
    """Whether `asked` can be spoken here (True while the deployment's voices are not known): one of
    its voices, or an OpenAI name (spoken by the table's voice or the deployment's default)."""
    return not voices or _has(voices, asked) or asked.lower() in OPENAI_VOICES
