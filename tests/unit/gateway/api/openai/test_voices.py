"""OpenAI's voice names as the model's voices (gateway/api/openai/voices.py): every name OpenAI's
published schemas list has one, the model's own names win, a deployment without the table's voice
speaks its default, and any other name is left for the talker's check to refuse."""

from __future__ import annotations

import typing

from openai.types.audio import speech_create_params
from openai.types.realtime import realtime_audio_config_output

from gateway.api.openai.voices import OPENAI_VOICES, known, speaker_for

VOICES = ("chelsie", "ethan", "aiden")


def _names(voice_type: typing.Any) -> set[str]:
    """The literal names in an SDK's `Voice` union."""
    return {
        name for arg in typing.get_args(voice_type) for name in typing.get_args(arg) if isinstance(name, str)
    }


def test_every_published_openai_voice_has_a_model_voice():
    published = _names(realtime_audio_config_output.Voice) | _names(speech_create_params.Voice)
    assert {"alloy", "ash", "marin", "cedar", "fable", "onyx", "nova"} <= published
    assert published <= set(OPENAI_VOICES)
    assert set(OPENAI_VOICES.values()) == set(VOICES)


def test_names_map_to_the_models_voices():
    assert [speaker_for(v, VOICES) for v in ("ash", "alloy", "Cedar", "ethan", "Chelsie")] == [
        "ethan",
        "chelsie",
        "aiden",
        "ethan",
        "Chelsie",
    ]
    assert speaker_for("ash", None) == "ethan"  # the talker's voices not known yet
    # No chelsie here: the deployment's default voice (its talker's Info), "" (the talker's) unknown.
    assert speaker_for("coral", ("ethan", "other"), "ethan") == "ethan"
    assert speaker_for("coral", ("other",), "other") == "other"
    assert speaker_for("coral", ("other",)) == ""
    assert speaker_for("nobody", VOICES) == "nobody"  # refused where the voice is checked


def test_a_deployments_own_voice_wins_over_the_table():
    assert speaker_for("alloy", ("alloy", "ethan")) == "alloy"


def test_known_voices():
    assert known("ash", VOICES) and known("ethan", VOICES) and known("anything", None)
    assert not known("nobody", VOICES)
    assert known("coral", ("other",))  # spoken by the deployment's default voice


def test_chat_completions_audio_voice_takes_openai_names_as_the_speech_endpoint_does():
    from types import SimpleNamespace

    from gateway.api.openai.chat import ChatCompletionRequest, to_generation_request
    from gateway.config import GatewayConfig

    deployment = SimpleNamespace(voices=VOICES, default_voice="ethan")
    core = SimpleNamespace(config=GatewayConfig(), deployment=deployment)

    def voice(asked: str) -> str:
        body = ChatCompletionRequest.model_validate(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "modalities": ["text", "audio"],
                "audio": {"voice": asked, "format": "wav"},
            }
        )
        request, _, _ = to_generation_request(body, core)  # type: ignore[arg-type]
        return request.speaker

    assert voice("ethan") == "ethan"
    assert voice("alloy") == speaker_for("alloy", VOICES) and voice("alloy") in VOICES
    assert voice("Ash") in VOICES
