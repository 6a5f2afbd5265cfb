"""A transcription request: the model card's ASR instruction, background work, greedy and text
only, a budget that grows with the audio; languages checked as ISO-639 codes."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.serving.transcription import (
    MIN_TOKENS,
    TOKENS_PER_SECOND,
    Transcript,
    check_language,
    instruction,
    transcription_request,
)
from omnistream.request.defaults import ServingDefaults
from omnistream.request.errors import InvalidRequest
from omnistream.request.media import AudioInput

AUDIO = {"type": "audio", "audio": AudioInput(np.zeros(16000, np.float32))}


def test_the_request_is_background_greedy_text_only_work_on_the_audio_and_the_instruction():
    request = transcription_request(AUDIO, 2.5, ServingDefaults(max_tokens=4096), "fr", "Bonjour")
    assert request.background and not request.return_audio
    assert request.sampling.temperature == 0.0
    assert request.max_tokens == MIN_TOKENS + 30 == MIN_TOKENS + 2.5 * TOKENS_PER_SECOND
    (turn,) = request.messages or []
    assert turn["role"] == "user"
    assert turn["content"][0] is AUDIO
    assert turn["content"][1]["text"].startswith("Transcribe the French audio into text.")
    assert "Bonjour" in turn["content"][1]["text"]


def test_the_budget_never_passes_the_deployment_s_limit():
    request = transcription_request(AUDIO, 600.0, ServingDefaults(max_tokens=256), None, None)
    assert request.max_tokens == 256


def test_the_instruction_names_only_the_model_s_languages():
    assert instruction("en", None) == "Transcribe the English audio into text."
    assert instruction("sw", None) == "Transcribe the audio into text."  # not one of the model's
    assert instruction(None, None) == "Transcribe the audio into text."


@pytest.mark.parametrize("bad", ["EN", "english", "e", "en-US", "ü1"])
def test_a_language_that_is_not_an_iso_code_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidRequest) as refused:
        check_language(bad, "language")
    assert refused.value.field == "language"


def test_iso_codes_and_nothing_pass():
    assert check_language("en") == "en"
    assert check_language("yue") == "yue"
    assert check_language(None) is None and check_language("") is None


def test_usage_is_the_audio_s_duration():
    assert Transcript("hi", 2.0004, 40, 3, "stop").usage() == {"type": "duration", "seconds": 2.0}
