"""The stage services speak an answer's words, never its tool call: the thinker service marks
what is spoken (ThinkerChunk.spoken), the gateway's wiring hands only that to the talker, and a
call alone ends the audio stages cleanly with no audio."""

from __future__ import annotations

import asyncio

import numpy as np

from gateway.serving.stage_calls import run_request
from omnistream.pipeline import AudioEvent, CodesEvent, DoneEvent, GenerationRequest, TextEvent

from .stage_calls import request_plan, stubs

QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
WORDS = "Let me look that up."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def _speak(stages, text: str, rid: str):
    """(text, codes [16, n], audio, done) of a given answer through the stage services."""
    request = GenerationRequest(
        messages=QUESTION, assistant_text=text, max_audio_frames=30, initial_codec_chunk_frames=4
    )

    async def run():
        said, frames, audio, done = [], [], [], None
        async for event in run_request(stubs(stages), request, rid, request_plan(request), with_codes=True):
            if isinstance(event, TextEvent):
                said.append(event.delta)
            elif isinstance(event, CodesEvent):
                frames.append(event.codes)
            elif isinstance(event, AudioEvent):
                audio.append(event.audio)
            elif isinstance(event, DoneEvent):
                done = event
        wav = np.concatenate(audio) if audio else np.zeros(0, np.float32)
        return "".join(said), np.array(frames, dtype=np.int64).reshape(-1, 16).T, wav, done

    return asyncio.run(run())


def test_words_with_a_call_sound_as_the_words_alone(stages):
    _, codes, audio, _ = _speak(stages, WORDS, "spoken-alone")
    text, call_codes, call_audio, done = _speak(stages, f"{WORDS} {CALL}", "spoken-with-call")
    assert text == f"{WORDS} {CALL}" and done.finish_reason == "stop"
    assert codes.shape[1] > 0
    np.testing.assert_array_equal(call_codes, codes)
    np.testing.assert_array_equal(call_audio, audio)


def test_a_call_alone_has_no_audio_and_no_error(stages):
    text, codes, audio, done = _speak(stages, CALL, "spoken-call-only")
    assert text == CALL and done.finish_reason == "stop"
    assert codes.shape[1] == 0 and audio.size == 0 and done.frames == 0 and done.audio_samples == 0
