"""A transcript in each response_format: exact srt and vtt (timestamps to the millisecond), and json
and verbose_json as openai-python's models read them."""

from __future__ import annotations

import zlib

import pytest
from openai.types.audio import Transcription, TranscriptionTextDoneEvent, TranscriptionVerbose

from gateway.api.openai.transcript_formats import (
    compression_ratio,
    language_name,
    rendered,
    segments,
    srt,
    timestamp,
    token_usage,
    vtt,
)
from gateway.serving.transcription import Transcript

TRANSCRIPT = Transcript("Hello there.", 2.5, 40, 3, "stop")


@pytest.mark.parametrize(
    ("seconds", "srt_time", "vtt_time"),
    [
        (0.0, "00:00:00,000", "00:00:00.000"),
        (2.5, "00:00:02,500", "00:00:02.500"),
        (1.0004, "00:00:01,000", "00:00:01.000"),
        (1.0005, "00:00:01,000", "00:00:01.000"),  # round half to even, at the millisecond
        (1.0016, "00:00:01,002", "00:00:01.002"),
        (59.9999, "00:01:00,000", "00:01:00.000"),  # rounding carries into the minutes
        (3723.456, "01:02:03,456", "01:02:03.456"),
        (360000.0, "100:00:00,000", "100:00:00.000"),
        (-0.2, "00:00:00,000", "00:00:00.000"),
    ],
)
def test_timestamps_are_exact_to_the_millisecond(seconds, srt_time, vtt_time):
    assert timestamp(seconds, ",") == srt_time
    assert timestamp(seconds, ".") == vtt_time


def test_srt_is_one_cue_over_the_whole_audio():
    assert srt("Hello there.", 2.5) == "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"


def test_vtt_is_its_header_and_one_cue_over_the_whole_audio():
    assert vtt("Hello there.", 61.25) == "WEBVTT\n\n00:00:00.000 --> 00:01:01.250\nHello there.\n\n"


def test_a_cue_has_no_blank_line_and_vtt_text_is_escaped():
    text = "a < b & c\n\n  --> d  \n"
    assert srt(text, 1.0) == "1\n00:00:00,000 --> 00:00:01,000\na < b & c\n--> d\n\n"
    assert vtt(text, 1.0) == "WEBVTT\n\n00:00:00.000 --> 00:00:01.000\na &lt; b &amp; c\n--&gt; d\n\n"


def test_a_transcript_without_words_has_no_segment():
    assert segments(" \n", 3.0) == []
    assert srt("", 3.0) == ""
    assert vtt("", 3.0) == "WEBVTT\n\n"


def test_json_is_openai_s_transcription_with_the_transcript_s_usage():
    body = rendered("json", TRANSCRIPT, 2.5, "en")
    assert body == {"text": "Hello there.", "usage": TRANSCRIPT.usage()}
    parsed = Transcription.model_validate(body)
    assert parsed.usage is not None and parsed.usage.model_dump(exclude_none=True) == TRANSCRIPT.usage()


def test_the_done_event_s_usage_is_the_thinker_s_tokens():
    usage = token_usage(TRANSCRIPT)
    assert usage == {"type": "tokens", "input_tokens": 40, "output_tokens": 3, "total_tokens": 43}
    done = TranscriptionTextDoneEvent.model_validate(
        {"type": "transcript.text.done", "text": "", "usage": usage}
    )
    assert done.usage is not None and done.usage.total_tokens == 43


def test_verbose_json_is_one_segment_from_zero_to_the_duration():
    body = rendered("verbose_json", TRANSCRIPT, 2.5004, "fr")
    parsed = TranscriptionVerbose.model_validate(body)
    assert parsed.text == "Hello there."
    assert parsed.language == "french" and parsed.duration == 2.5
    assert parsed.usage is not None and parsed.usage.seconds == 2.5
    (segment,) = parsed.segments or []
    assert (segment.id, segment.seek, segment.start, segment.end) == (0, 0, 0.0, 2.5)
    assert segment.text == "Hello there." and segment.temperature == 0.0
    assert segment.compression_ratio == len(b"Hello there.") / len(zlib.compress(b"Hello there."))
    assert parsed.words is None


def test_text_formats_are_strings():
    assert rendered("text", TRANSCRIPT, 1.0, None) == "Hello there.\n"
    assert rendered("srt", TRANSCRIPT, 1.0, None) == srt("Hello there.", 1.0)
    assert rendered("vtt", TRANSCRIPT, 1.0, None) == vtt("Hello there.", 1.0)


def test_language_names_as_whisper_writes_them():
    assert language_name("en") == "english"
    assert language_name("yue") == "cantonese"
    assert language_name("sw") == "sw"  # not one of the model's: the code as given
    assert language_name(None) == "unknown"


def test_compression_ratio_of_nothing_is_zero():
    assert compression_ratio("") == 0.0
    assert compression_ratio("ha" * 100) > 2.4  # Whisper's "repetitive" threshold
