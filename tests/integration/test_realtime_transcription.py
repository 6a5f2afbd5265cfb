"""Input transcription on the real processes: with `audio.input.transcription` set, a spoken turn
found by the server VAD gets `conversation.item.input_audio_transcription.delta` events and
`.completed` (the deltas make the transcript; usage counted; the item keeps it for a retrieve),
made by the thinker as background work that never delays the spoken answer: no thinker step holds
both. Without the setting, no transcript.
The tiny model's words are noise; the protocol, the timing and the priority are what is tested."""

from __future__ import annotations

import asyncio

import pytest

from tests.integration.conftest import configured_gateway, gateway_idle, shared_thinker_steps, wait_for
from tests.integration.test_realtime_protocol import Client, b64, opened
from tests.integration.test_realtime_schemas import connect
from tests.realtime_schemas import check_server_events
from tests.speech import RATE, pieces, silence_pcm16, speech_pcm16

API_KEY = "schemas-test-key"  # test_realtime_schemas.connect's
TRANSCRIBED = "conversation.item.input_audio_transcription"
ANSWER_TOKENS = 40  # the answer's words: long enough that unprioritised work would interleave


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    with configured_gateway(stages, tmp_path_factory.mktemp("transcription"), {"api_key": API_KEY}) as gw:
        yield gw


def setup(beta: bool, transcription: dict | None) -> dict:
    detection = {"type": "server_vad", "silence_duration_ms": 400}
    extra = {"max_output_tokens": ANSWER_TOKENS, "omnistream": {"ignore_eos": True}}
    if beta:
        session = {"turn_detection": detection, "input_audio_transcription": transcription, **extra}
    else:
        audio = {"input": {"turn_detection": detection, "transcription": transcription}}
        session = {"type": "realtime", "audio": audio, **extra}
    return {"type": "session.update", "session": session}


async def spoken_turn(c: Client) -> None:
    """Speech then silence, paced as a microphone sends it (the VAD ends the turn)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    audio = silence_pcm16(0.2) + speech_pcm16("What is the weather like today?") + silence_pcm16(0.8)
    for i, piece in enumerate(pieces(audio)):
        await c.send({"type": "input_audio_buffer.append", "audio": b64(piece)})
        await asyncio.sleep(max(0.0, start + (i + 1) * len(piece) / 2 / RATE - loop.time()))


@pytest.mark.parametrize("beta", [False, True], ids=["ga", "beta"])
def test_a_spoken_turn_is_transcribed_after_its_answer_s_words(gateway, stages, beta):
    asked = {"model": "gpt-4o-mini-transcribe", "language": "en"}
    text_delta = "response.audio_transcript.delta" if beta else "response.output_audio_transcript.delta"

    shared_before = shared_thinker_steps(stages)

    async def run() -> list[dict]:
        async with connect(gateway, beta) as ws:
            c = await opened(ws)
            await c.send(setup(beta, asked))
            updated = await c.until("session.updated")
            shown = updated["session"]["input_audio_transcription" if beta else "audio"]
            assert (shown if beta else shown["input"]["transcription"]) == asked
            await spoken_turn(c)
            committed = await c.until("input_audio_buffer.committed")
            # Either may come first: the transcript once the answer's words are made, the
            # response's end once its audio is.
            async with asyncio.timeout(120):
                while not {"response.done", f"{TRANSCRIBED}.completed"} <= {e["type"] for e in c.seen}:
                    await c.next()
            completed = next(e for e in c.seen if e["type"] == f"{TRANSCRIBED}.completed")
            assert completed["item_id"] == committed["item_id"]
            await c.send({"type": "conversation.item.retrieve", "item_id": committed["item_id"]})
            retrieved = await c.until("conversation.item.retrieved")
            assert retrieved["item"]["content"][0]["transcript"] == completed["transcript"]
            return c.seen

    seen = asyncio.run(run())
    deltas = [e for e in seen if e["type"] == f"{TRANSCRIBED}.delta"]
    completed = next(e for e in seen if e["type"] == f"{TRANSCRIBED}.completed")
    assert deltas and "".join(e["delta"] for e in deltas) == completed["transcript"]
    assert {e["content_index"] for e in deltas} == {0} and completed["content_index"] == 0
    assert completed["usage"]["type"] == "duration" and 1.0 < completed["usage"]["seconds"] < 5.0
    # Background work: the transcription and the answer were at the thinker together (both start
    # at the commit), yet no thinker step held both: the transcription stepped only when the answer
    # could not. (The order their words reach the client is not asserted: the gateway hands each of
    # the answer's words to the talker before it reads the next, so on a loaded machine some reach
    # the client after transcript words the thinker made later.)
    assert [e["type"] for e in seen].count(text_delta) >= 10
    assert shared_thinker_steps(stages) == shared_before, "a thinker step held the answer and the transcript"
    assert check_server_events(seen, beta) == []
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))


def test_without_the_setting_nothing_is_transcribed(gateway, stages):
    async def run() -> list[dict]:
        async with connect(gateway, False) as ws:
            c = await opened(ws)
            await c.send(setup(False, None))
            await c.until("session.updated")
            await spoken_turn(c)
            await c.until("response.done")
            return c.seen

    seen = asyncio.run(run())
    assert not [e for e in seen if e["type"].startswith(TRANSCRIBED)]
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))
