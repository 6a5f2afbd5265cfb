"""The input audio buffer without a server (input_audio.py): a commit too short to be a turn is
refused and one long enough becomes a decoded, settled user item; a full buffer and appends that run
ahead of real time are refused; a turn_detection change starts the new detector at the buffer's end;
semantic_vad is served by the detector with its eagerness's silence window.
The server VAD's turns over real audio are tests/integration/test_realtime_vad.py's."""

from __future__ import annotations

import asyncio
import base64
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gateway.config import GatewayConfig
from gateway.media.decode_pool import MediaDecoder
from gateway.media.file_decode import Deadline, decode_audio
from gateway.media.limits import MediaLimits, Tally
from gateway.realtime.audio import FEATURE_HOP, FEATURE_WINDOW, wav_of
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.events import BufferAppend, EventError
from gateway.realtime.input_audio import InputAudio
from gateway.realtime.session_config import SessionConfig
from gateway.realtime.settings import InputTranscription, TurnDetection
from gateway.realtime.vad import INPUT_RATE
from gateway.serving.metrics import GatewayMetrics
from omnistream.request.errors import Unavailable
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import AudioInput
from tests.speech import speech_pcm16


async def _none(*args: Any) -> None:
    return None


async def _no_speculation(end: int, pcm: bytes) -> None:
    return None


class Harness:
    """An InputAudio with its session's turn detection off, the events it sends and the items it adds."""

    def __init__(self, **config: Any) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []
        self.added: list[tuple[Item, str | None]] = []
        self.ahead: list[GenerationRequest] = []  # what work ahead asked the thinker
        self.opening: asyncio.Event | None = None
        core = SimpleNamespace(
            config=GatewayConfig(**config),
            deployment=SimpleNamespace(input_modalities=None, voices=None, default_voice=None),
            media=MediaDecoder(MediaLimits()),
            open=self._open,
            metrics=GatewayMetrics(),
        )
        self.config = SessionConfig(turn_detection=None)
        responder = SimpleNamespace(
            response=None,
            busy=False,
            speculation_for=_no_speculation,
            drop_speculation=_none,
            cache_scope=b"the session's",
        )
        self.transcribing: list[tuple[str, Any]] = []  # (item id, the transcription asked)
        transcriber = SimpleNamespace(start=lambda item, asked: self.transcribing.append((item.id, asked)))
        self.audio = InputAudio(
            core, self.config, self._send, Conversation(), self._add, responder, transcriber
        )  # type: ignore[arg-type]

    async def _open(self, request: GenerationRequest, **_: Any) -> None:
        self.ahead.append(request)
        if self.opening is not None:  # a thinker that takes its time
            await self.opening.wait()
        raise Unavailable("no thinker here")  # only the requests are looked at

    async def _send(self, kind: str, **fields: Any) -> None:
        self.sent.append((kind, fields))

    async def _add(self, item: Item, previous: str | None) -> None:
        self.added.append((item, previous))

    async def append(self, seconds: float, event_id: str = "a", pcm: bytes | None = None) -> None:
        """`seconds` of silence, or `pcm`."""
        pcm = bytes(int(seconds * INPUT_RATE) * 2) if pcm is None else pcm
        encoded = base64.b64encode(pcm).decode()
        event = BufferAppend(type="input_audio_buffer.append", audio=encoded, event_id=event_id)
        await self.audio.append(event)


def test_a_commit_too_short_for_a_turn_is_refused_and_a_long_enough_one_becomes_a_settled_item():
    async def run() -> tuple[Harness, EventError]:
        h = Harness()
        await h.append(0.05)
        with pytest.raises(EventError) as short:
            await h.audio.commit(None, "c1")
        await h.append(0.2)
        assert await h.audio.commit(None, "c2")
        return h, short.value

    h, short = asyncio.run(run())
    assert short.code == "input_audio_buffer_commit_empty" and short.event_id == "c1"
    assert "holds 50 ms; at least 100 ms" in short.message
    ((item, previous),) = h.added
    assert h.sent == [("input_audio_buffer.committed", {"previous_item_id": None, "item_id": item.id})]
    assert previous is None and item.role == "user" and item.audio_seconds == pytest.approx(0.2)
    audio = item.parts[0]["audio"]
    assert isinstance(audio, AudioInput) and audio.samples.size % FEATURE_HOP == 0
    assert audio.samples.size >= 3200 + FEATURE_WINDOW and not audio.samples[3200:].any()
    assert len(h.audio.buffer.data) == 0


def test_a_full_buffer_refuses_the_append_until_it_is_cleared():
    async def run() -> tuple[Harness, EventError]:
        h = Harness(realtime_max_buffer_seconds=0.5)
        await h.append(0.4)
        with pytest.raises(EventError) as full:
            await h.append(0.2)
        await h.audio.clear()
        await h.append(0.4)
        return h, full.value

    h, full = asyncio.run(run())
    assert full.code == "input_audio_buffer_full" and "(0.5 s)" in full.message
    assert [kind for kind, _ in h.sent] == ["input_audio_buffer.cleared"]
    assert h.audio.buffer.start == int(0.4 * INPUT_RATE) and h.audio.buffer.end == int(0.8 * INPUT_RATE)


def test_appends_further_ahead_of_real_time_than_the_burst_are_dropped():
    async def run() -> tuple[Harness, EventError]:
        h = Harness(realtime_append_burst_seconds=1.0)
        await h.append(0.9)
        with pytest.raises(EventError) as ahead:
            await h.append(0.9)
        return h, ahead.value

    h, ahead = asyncio.run(run())
    assert ahead.code == "input_audio_buffer_rate_exceeded" and ahead.error_type == "rate_limit_error"
    assert h.audio.buffer.end == int(0.9 * INPUT_RATE)  # the dropped append left the buffer as it was


def test_a_turn_detection_change_starts_the_new_detector_at_the_buffers_end():
    async def run() -> Harness:
        h = Harness()
        await h.append(0.3)
        h.audio.turn_item_id = "item_x"
        h.config.turn_detection = TurnDetection()
        await h.audio.detection_changed()
        return h

    h = asyncio.run(run())
    assert h.audio.detector is not None and h.audio.detector.position == h.audio.buffer.end > 0
    assert h.audio.turn_item_id is None


@pytest.mark.parametrize(
    ("eagerness", "window"), [("high", 400), ("auto", 800), ("medium", 800), ("low", 1500)]
)
def test_semantic_vad_is_served_by_the_detector_with_its_eagerness_window(eagerness, window):
    h = Harness()
    h.config.turn_detection = TurnDetection(type="semantic_vad", eagerness=eagerness)
    asyncio.run(h.audio.detection_changed())
    assert h.audio.detector is not None and h.audio.detector.silence_duration_ms == window


def test_a_committed_turn_is_transcribed_only_when_the_session_asks():
    async def run() -> Harness:
        h = Harness()
        await h.append(0.5)
        await h.audio.commit(None, "c1")
        h.config.transcription = InputTranscription(model="gpt-4o-mini-transcribe", language="en")
        await h.append(0.5)
        await h.audio.commit(None, "c2")
        return h

    h = asyncio.run(run())
    second = h.added[1][0]
    assert [item_id for item_id, _ in h.transcribing] == [second.id]
    assert h.transcribing[0][1].language == "en"


def test_a_turn_s_audio_goes_ahead_at_each_interval_of_it_from_the_item_s_start():
    """Work ahead (gateway/realtime/work_ahead.py): the audio so far, at each realtime_work_ahead_ms
    of new audio, as an encode-only thinker request in the session's scope; one in flight at once;
    a commit starts the count again. What it sends is the start of what the commit decodes, and the
    commit decodes what the media decoder would (gateway/realtime/turn_resampler.py)."""
    speech = speech_pcm16("Hello there, how are you doing today?") + speech_pcm16("The weather is fine.")
    piece = int(0.6 * INPUT_RATE) * 2

    async def run() -> Harness:
        h = Harness(realtime_work_ahead_ms=1000)
        await h.append(0, pcm=speech[:piece])
        await asyncio.sleep(0)
        assert h.ahead == []
        await h.append(0, pcm=speech[piece : 2 * piece])  # 1.2 s: sent
        for _ in range(3):
            await asyncio.sleep(0)
        await h.append(0, pcm=speech[2 * piece : 4 * piece])  # 2.4 s: sent again
        for _ in range(3):
            await asyncio.sleep(0)
        await h.audio.commit(None, "c")
        await h.append(0.5)  # a new turn: nothing yet
        for _ in range(3):
            await asyncio.sleep(0)
        return h

    h = asyncio.run(run())
    assert len(h.ahead) == 2
    ((item, _),) = h.added
    committed = item.parts[0]["audio"].samples
    turn = speech[: 4 * piece]
    assert len(turn) == 4 * piece
    decoded = decode_audio(wav_of(turn), "audio/wav", "f", Tally(MediaLimits()), Deadline(60)).samples
    assert np.array_equal(committed[: decoded.size], decoded) and not committed[decoded.size :].any()
    for request, seconds in zip(h.ahead, (1.2, 2.4), strict=True):
        assert request.encode_only and not request.return_audio and request.cache_scope == b"the session's"
        (part,) = request.messages[0]["content"]
        assert part["type"] == "audio" and isinstance(part["audio"], AudioInput)
        sent = part["audio"].samples
        assert seconds * 16000 - 600 < sent.size < seconds * 16000  # all but the filter's reach
        assert np.array_equal(sent, decoded[: sent.size])
    failed = h.audio.core.metrics.work_ahead.labels(outcome="failed")._value.get()
    assert failed == 2


def test_without_the_setting_nothing_goes_ahead():
    async def run() -> Harness:
        h = Harness(realtime_work_ahead_ms=0)
        await h.append(2.5)
        await asyncio.sleep(0)
        return h

    assert asyncio.run(run()).ahead == []


def test_a_commit_cancels_the_work_ahead_in_flight():
    async def run() -> Harness:
        h = Harness(realtime_work_ahead_ms=1000)
        h.opening = asyncio.Event()  # never set: the thinker is still at it
        await h.append(1.2)
        for _ in range(3):
            await asyncio.sleep(0)
        await h.append(1.2)  # due again, but one is in flight
        await h.audio.commit(None, "c")
        for _ in range(3):
            await asyncio.sleep(0)
        return h

    h = asyncio.run(run())
    assert len(h.ahead) == 1
    assert h.audio.core.metrics.work_ahead.labels(outcome="cancelled")._value.get() == 1
