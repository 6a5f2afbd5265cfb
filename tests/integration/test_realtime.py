"""/v1/realtime end to end with the official openai SDK's realtime client, on the real processes:
speech rendered by espeak-ng, streamed in 20 ms pieces at real time, found by the server VAD,
answered with text and audio deltas; a second turn that uses the history; a barge-in; a long
conversation kept whole on the default context, and the oldest turns dropped on a small one."""

from __future__ import annotations

import asyncio
import base64
import itertools

import numpy as np
import pytest
from openai import AsyncOpenAI

from tests.integration.conftest import (
    configured_gateway,
    gateway_idle,
    gateway_url,
    metric,
    metric_at,
    wait_for,
)
from tests.speech import pieces, silence_pcm16, speech_pcm16

API_KEY = "realtime-test-key"
VAD = {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 200, "silence_duration_ms": 400}


@pytest.fixture(scope="module")
def gateway(stages, tmp_path_factory):
    with configured_gateway(stages, tmp_path_factory.mktemp("realtime"), {"api_key": API_KEY}) as gw:
        yield gw


@pytest.fixture(scope="module")
def small_context_gateway(stages, tmp_path_factory):
    """A gateway whose realtime conversations may fill 256 tokens of the thinker's 4096."""
    config = {"api_key": API_KEY, "realtime_context_tokens": SMALL_CONTEXT}
    with configured_gateway(stages, tmp_path_factory.mktemp("realtime-small"), config) as gw:
        yield gw


SMALL_CONTEXT = 256


def client(gateway) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{gateway_url(gateway)}/v1", api_key=API_KEY)


async def speak(conn, pcm: bytes, trailing_silence: float = 0.8) -> None:
    """Send speech then silence in 20 ms pieces, paced at real time like a microphone."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    for i, piece in enumerate(pieces(silence_pcm16(0.2) + pcm + silence_pcm16(trailing_silence))):
        await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())
        delay = start + (i + 1) * 0.02 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)


async def events_until(conn, kind: str, seen: list, timeout: float = 120.0):
    """Collect events into `seen` until one of type `kind` arrives; returns it."""
    async with asyncio.timeout(timeout):
        async for event in conn:
            seen.append(event)
            if event.type == kind:
                return event
    raise AssertionError(f"the connection closed before {kind}")


def types(seen: list) -> list[str]:
    return [e.type for e in seen]


async def spoken_turn(conn, text: str) -> tuple[list, object]:
    """Speak `text` while reading events; returns all events up to response.done, and it."""
    seen: list = []
    speaker = asyncio.create_task(speak(conn, speech_pcm16(text)))
    try:
        done = await events_until(conn, "response.done", seen)
    finally:
        await speaker
    return seen, done


def finished(done) -> bool:
    """Ended normally: completed, or cut at max_output_tokens (the tiny random model rarely stops)."""
    response = done.response
    if response.status == "incomplete":
        return response.status_details.reason == "max_output_tokens"
    return response.status == "completed"


def test_spoken_turns_use_vad_and_history(gateway, stages):
    async def run():
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            created = await conn.recv()
            assert created.type == "session.created"
            await conn.session.update(
                session={
                    "type": "realtime",
                    "instructions": "You are a helpful assistant.",
                    "output_modalities": ["audio"],
                    "audio": {
                        "input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": VAD}
                    },
                    "max_output_tokens": 12,
                    "omnistream": {"seed": 1, "max_audio_frames": 30},
                }
            )
            updated = await conn.recv()
            assert updated.type == "session.updated", updated
            assert updated.session.audio.input.turn_detection.silence_duration_ms == 400

            first, done1 = await spoken_turn(conn, "Hello, can you tell me what time it is?")
            kinds = types(first)
            for kind in (
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                "conversation.item.added",
                "response.created",
                "response.output_audio_transcript.delta",
                "response.output_audio.delta",
                "response.output_audio.done",
                "response.output_audio_transcript.done",
            ):
                assert kind in kinds, (kind, kinds)
            assert kinds.index("input_audio_buffer.speech_started") < kinds.index(
                "input_audio_buffer.committed"
            )
            assert kinds.index("response.created") < kinds.index("response.output_audio.delta")
            assert finished(done1), done1.response
            usage1 = done1.response.usage
            assert usage1.input_tokens > 0 and usage1.output_tokens > 0
            audio = b"".join(
                base64.b64decode(e.delta) for e in first if e.type == "response.output_audio.delta"
            )
            assert len(audio) > 0 and len(audio) % 2 == 0
            extra = done1.response.model_extra["omnistream"]
            assert extra["ttft_ms"] > 0 and extra["ttfa_ms"] > 0 and extra["rtf"] > 0
            assert set(extra["replicas"]) == {"thinker", "talker", "code2wav"}
            # What a listener heard of the spoken answer (omnistream/audio/listener.py).
            assert extra["stalls"] >= 0 and extra["underrun_ms"] >= 0 and extra["stall_ms"] >= 0
            assert isinstance(extra["continuity_ok"], bool)

            longer = "Hello again: what time is it now, and what will the weather be like tomorrow?"
            _, done2 = await spoken_turn(conn, longer)
            assert finished(done2), done2.response
            # The prompt grew by the first turn (its audio and the answer) and the longer second one.
            assert done2.response.usage.input_tokens > 2 * usage1.input_tokens + usage1.output_tokens
            # ... and starts with the first turn's whole prompt, which the thinker kept (its audio
            # too: settled, its features are the same before the longer turn as they were alone).
            assert done2.response.usage.input_token_details.cached_tokens >= usage1.input_tokens

    asyncio.run(run())
    assert asyncio.run(wait_for(lambda: gateway_idle(gateway, stages), 10))


def test_barge_in_cancels_every_stage(gateway, stages):
    async def run():
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            await conn.recv()
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {"input": {"turn_detection": VAD}},
                    "max_output_tokens": 1000,
                    "omnistream": {"ignore_eos": True, "seed": 2},
                }
            )
            seen: list = []
            speaker = asyncio.create_task(speak(conn, speech_pcm16("Please tell me a very long story.")))
            await events_until(conn, "response.output_audio.delta", seen)
            await speaker
            # No trailing silence: the interruption must not end as a turn of its own (VAD would
            # commit it and answer it) if response.done reaches us late, as on a loaded machine.
            interrupt = asyncio.create_task(
                speak(conn, speech_pcm16("Stop, stop please."), trailing_silence=0)
            )
            try:
                started = await events_until(conn, "input_audio_buffer.speech_started", seen)
                done = await events_until(conn, "response.done", seen)
            finally:
                interrupt.cancel()
            assert done.response.status == "cancelled", done.response
            assert done.response.status_details.reason == "turn_detected"
            item_id = done.response.output[0].id
            # None of its audio follows speech_started, and the item keeps exactly the audio sent.
            after = seen[next(i for i, e in enumerate(seen) if e is started) :]
            assert not [e for e in after if e.type == "response.output_audio.delta"]
            received = sum(
                len(base64.b64decode(e.delta))
                for e in seen
                if e.type == "response.output_audio.delta" and e.item_id == item_id
            )
            truncated = [e for e in seen if e.type == "conversation.item.truncated"]
            assert truncated and truncated[0].item_id == item_id
            assert truncated[0].audio_end_ms == received // 2 * 1000 // 24000 > 0
            # Every stage is idle while the session is still open.
            assert await wait_for(lambda: gateway_idle(gateway, stages), 10)
            assert metric_at(f"{gateway_url(gateway)}/metrics", "omnistream_realtime_barge_ins_total") >= 1

    asyncio.run(run())


async def text_turns(conn, count: int, max_output_tokens: int) -> tuple[list, list]:
    """`count` typed turns, each answered in text: (every event, each turn's response.done)."""
    seen: list = []
    dones = []
    for k in range(count):
        content = [{"type": "input_text", "text": f"Turn {k}: what should I cook tonight?"}]
        await conn.conversation.item.create(item={"type": "message", "role": "user", "content": content})
        await conn.response.create(
            response={"output_modalities": ["text"], "max_output_tokens": max_output_tokens}
        )
        dones.append(await events_until(conn, "response.done", seen, timeout=60))
    return seen, dones


async def text_session(gateway, count: int, max_output_tokens: int) -> tuple[list, list]:
    async with client(gateway).realtime.connect(model="omnistream") as conn:
        await conn.recv()
        session = {
            "type": "realtime",
            "audio": {"input": {"turn_detection": None}},
            "omnistream": {"seed": 5},
        }
        await conn.session.update(session=session)
        assert (await conn.recv()).type == "session.updated"
        return await text_turns(conn, count, max_output_tokens)


def test_a_long_conversation_keeps_every_item_on_the_default_context(gateway):
    """18 turns (36 items, past the 16 items a session once kept): nothing is dropped, each prompt
    holds the whole history (it keeps growing) and starts with the previous one (cached)."""
    seen, dones = asyncio.run(text_session(gateway, 18, 4))
    assert all(finished(d) for d in dones), [d.response.status for d in dones]
    assert "conversation.item.deleted" not in types(seen)
    inputs = [d.response.usage.input_tokens for d in dones]
    assert all(b > a for a, b in itertools.pairwise(inputs)), inputs
    last = dones[-1].response.usage
    assert last.input_token_details.cached_tokens >= inputs[-2]


def test_a_small_context_drops_the_oldest_turns_and_answers_the_newest(small_context_gateway):
    seen, dones = asyncio.run(text_session(small_context_gateway, 14, 8))
    assert all(finished(d) for d in dones), [d.response.status for d in dones]
    inputs = [d.response.usage.input_tokens for d in dones]
    assert all(n + 8 <= SMALL_CONTEXT for n in inputs), inputs
    deleted = [e.item_id for e in seen if e.type == "conversation.item.deleted"]
    added = list(dict.fromkeys(e.item.id for e in seen if e.type == "conversation.item.added"))
    assert deleted and deleted == added[: len(deleted)]  # oldest first, each once
    assert added[-1] not in deleted and added[-2] not in deleted  # the newest turn and its answer
    assert inputs[-1] > SMALL_CONTEXT // 2  # drops keep the history near the context, not empty
    url = f"{gateway_url(small_context_gateway)}/metrics"
    assert metric_at(url, "omnistream_realtime_history_dropped_items_total") == len(deleted)


def test_a_session_finds_only_its_own_turns_and_its_cache_share_goes_when_it_ends(gateway, stages):
    """Each session is its own cache scope (a secret the gateway keeps): a second session saying
    exactly what the first said finds nothing of it, yet finds its own first turn; when a session
    closes, the thinker drops its blocks (released, in its /metrics)."""
    released = "omnistream_stage_prefix_cache_released_blocks_total"
    before = metric(stages["thinker"], released)
    _, first = asyncio.run(text_session(gateway, 2, 4))
    assert asyncio.run(wait_for(lambda: metric(stages["thinker"], released) > before, 10))
    _, second = asyncio.run(text_session(gateway, 2, 4))
    assert [d.response.usage.input_tokens for d in second] == [d.response.usage.input_tokens for d in first]
    assert second[0].response.usage.input_token_details.cached_tokens == 0  # not the other session's
    assert (
        second[1].response.usage.input_token_details.cached_tokens
        >= first[0].response.usage.input_tokens // 16 * 16
    )


def test_a_spoken_item_is_found_again_after_a_longer_one(gateway, stages):
    """Audio items as a microphone gives them (a noise floor, any length): the first turn's whole
    prompt is found at the second, longer turn, because the gateway settles each item's audio
    (gateway/realtime/audio.py); unsettled, its features would change before the longer audio.
    The second turn sends the first item's audio as its digest (the thinker kept it for the
    session: one hit), and the thinker frees what it kept when the session ends."""
    rng = np.random.default_rng(0)
    hits, kept = "omnistream_thinker_scope_audio_hits_total", "omnistream_thinker_scope_audio_bytes"
    hits_before, kept_before = metric(stages["thinker"], hits), metric(stages["thinker"], kept)

    def mic(text: str, cut: int) -> str:
        speech = np.frombuffer(speech_pcm16(text), dtype="<i2")[:-cut].astype(np.int32)
        noisy = np.clip(speech + rng.integers(-40, 40, speech.size), -32768, 32767).astype("<i2")
        return base64.b64encode(noisy.tobytes()).decode()

    async def run():
        async with client(gateway).realtime.connect(model="omnistream") as conn:
            await conn.recv()
            session = {
                "type": "realtime",
                "audio": {"input": {"turn_detection": None}},
                "omnistream": {"seed": 2},
            }
            await conn.session.update(session=session)
            assert (await conn.recv()).type == "session.updated"
            dones = []
            for text, cut in (
                ("What time is it?", 7),
                ("And what will the weather be like tomorrow, and after?", 11),
            ):
                content = [{"type": "input_audio", "audio": mic(text, cut)}]
                await conn.conversation.item.create(
                    item={"type": "message", "role": "user", "content": content}
                )
                await conn.response.create(response={"output_modalities": ["text"], "max_output_tokens": 4})
                dones.append(await events_until(conn, "response.done", [], timeout=60))
            return dones

    first, second = asyncio.run(run())
    assert finished(first) and finished(second)
    assert second.response.usage.input_token_details.cached_tokens >= first.response.usage.input_tokens
    assert metric(stages["thinker"], hits) == hits_before + 1
    # <=: an earlier test's session may still be releasing what it kept when `kept_before` was read
    assert asyncio.run(wait_for(lambda: metric(stages["thinker"], kept) <= kept_before, 10))
