"""The input audio buffer's events (`input_audio_buffer.*`): appends decoded from the session's
input format to pcm16 24 kHz (gateway/realtime/formats.py) and checked for their rate and the
buffer's room, the server VAD's turns (speech_started, speech_stopped), and commits, each of
which makes a user audio item.

Its own owner because the buffer, the rate bucket, the detector and the item a detected turn will
become change together, on appends, and nowhere else. The connection hands over the session's
config (its turn_detection, read as it is now), the conversation a committed turn joins (and how it
is added, with its events), and the responder that a turn's end starts and a barge-in stops.

With server turn detection, a pause in the speech long enough (the window less the gateway's
`realtime_speculation_lead_ms`) starts the turn's answer speculatively on the audio the commit will
hold, which the decision releases and resumed speech cancels (gateway/realtime/speculation.py).

The buffer's audio is resampled for the thinker as it arrives while a turn is open
(gateway/realtime/turn_resampler.py), so a commit, the speculation and the work ahead take their
audio from it at a cost that does not grow with the turn.

A committed turn carries when its speech ended (`SpokenTurn`, gateway/realtime/voice_to_voice.py):
where the VAD found the end, or the end of the committed audio, placed in time by the arrival of the
append that held it (the buffer keeps its appends' arrivals).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gateway.realtime import events as ev
from gateway.realtime.audio import decode_base64_pcm, ms_of, settled, wav_size
from gateway.realtime.conversation import Conversation, Item
from gateway.realtime.events import EventError
from gateway.realtime.formats import InputDecoder
from gateway.realtime.input_buffer import AppendRate, InputBuffer
from gateway.realtime.input_transcription import InputTranscriber
from gateway.realtime.items import check_modality
from gateway.realtime.protocol import new_id
from gateway.realtime.responder import Responder
from gateway.realtime.session_config import SessionConfig
from gateway.realtime.speculation import RESUMED, UNUSED, Parts
from gateway.realtime.turn_resampler import TurnResampler, resample_whole
from gateway.realtime.vad import INPUT_RATE, SpeechDetector
from gateway.realtime.voice_to_voice import CLIENT_COMMIT, SpokenTurn
from gateway.realtime.work_ahead import WorkAhead
from gateway.serving.core import GatewayCore
from omnistream.request.errors import OmniError
from omnistream.request.media import AudioInput

MIN_COMMIT_MS = 100  # OpenAI refuses to commit less

Send = Callable[..., Awaitable[None]]  # Connection.send: (kind, **fields)
AddItem = Callable[[Item, str | None], Awaitable[None]]  # Connection._add_item: (item, previous id)


class InputAudio:
    def __init__(
        self,
        core: GatewayCore,
        config: SessionConfig,
        send: Send,
        conversation: Conversation,
        add_item: AddItem,
        responder: Responder,
        transcriber: InputTranscriber,
        on_barge_in: Callable[[], None] = lambda: None,
    ) -> None:
        c = core.config
        self.core = core
        self.config = config
        self.send = send
        self.conversation = conversation
        self.add_item = add_item
        self.responder = responder
        self.transcriber = transcriber  # the committed turns' transcripts, when the session asks
        self.on_barge_in = on_barge_in
        self.buffer = InputBuffer(int(c.realtime_max_buffer_seconds * INPUT_RATE) * 2)
        self.rate = AppendRate(c.realtime_append_burst_seconds)
        self.detector = self._detector()
        self.turn_item_id: str | None = None  # the user item a detected turn will become
        self.decoder = InputDecoder(config.input_format)  # the wire's format -> pcm16 24 kHz
        self.resampled = TurnResampler()  # the open turn's audio at 16 kHz, as it arrives
        # The turn's audio encoded while it is spoken (work_ahead.py).
        every = c.realtime_work_ahead_ms * INPUT_RATE // 1000 * 2
        self.work_ahead = WorkAhead(core, responder.cache_scope, every)

    def _detector(self) -> SpeechDetector | None:
        td = self.config.turn_detection
        if td is None:
            return None
        served = td.served()  # semantic_vad: the silence window of its eagerness
        lead = self.core.config.realtime_speculation_lead_ms
        speculates = lead > 0 and td.create_response
        pause = max(0, served.silence_duration_ms - lead) if speculates else None
        return SpeechDetector(served.threshold, served.silence_duration_ms, pause)

    async def detection_changed(self) -> None:
        """session.update changed turn_detection: a turn under way is forgotten, and the new
        detector counts from the buffer's end (its positions are stream samples, as the buffer's)."""
        await self.responder.drop_speculation(UNUSED)
        self.detector = self._detector()
        if self.detector is not None:
            self.detector.position = self.buffer.end
        self.turn_item_id = None

    def _decoder(self) -> InputDecoder:
        """The decoder of the session's input format (a new one, with a fresh resampler, when
        session.update changed it)."""
        if self.decoder.format is not self.config.input_format:
            self.decoder = InputDecoder(self.config.input_format)
        return self.decoder

    async def append(self, event: ev.BufferAppend) -> None:
        arrived = time.monotonic()
        decoder = self._decoder()
        fmt = decoder.format
        wire = decode_base64_pcm(
            event.audio, "audio", fmt.bytes_for(self.buffer.max_bytes), event.event_id, fmt
        )
        pcm = decoder.decode(wire)  # pcm16 24 kHz, what the buffer and the VAD take
        seconds = len(pcm) / 2 / INPUT_RATE
        if not self.rate.take(seconds):
            raise EventError(
                "audio is arriving faster than real time (more than "
                f"{self.rate.burst:g} s ahead): this append was dropped",
                code="input_audio_buffer_rate_exceeded",
                error_type="rate_limit_error",
            )
        if not self.buffer.append(pcm, arrived):
            if self.detector is None or not self.detector.in_speech:
                raise self._buffer_full()
            # A turn as long as the buffer (continuous speech, or a noise the VAD takes for it)
            # ends here: a server-VAD client never commits or clears, so refusing would wedge it.
            self.detector.reset()
            await self.speech_stopped(self.buffer.end)
            if not self.buffer.append(pcm, arrived):
                raise self._buffer_full()
        if self.detector is None:
            self._follow()
            return
        for found in self.detector.process(pcm):
            if found.kind == "started":
                await self.speech_started(found.sample)
            elif found.kind == "paused":
                self.speech_paused(found.sample)
            elif found.kind == "resumed":
                await self.responder.drop_speculation(RESUMED)
            else:
                await self.speech_stopped(found.sample)
        if not self.detector.in_speech and self.config.turn_detection is not None:
            prefix = self.config.turn_detection.prefix_padding_ms * INPUT_RATE // 1000
            self.buffer.keep_from(self.buffer.end - prefix)
        else:
            self._follow()

    def _follow(self) -> None:
        """A turn is open (in speech, or no turn detection): its audio so far, from where its item
        will start (server VAD: while in speech, the buffer's start stays), is resampled, and goes
        to work ahead when enough is new (after the pause, the speculation encodes what is left)."""
        self.resampled.advance(self.buffer.start, self.buffer.data)
        paused = self.detector is not None and self.detector.paused
        if not paused and self.work_ahead.due(len(self.buffer.data)):
            self.work_ahead.send(len(self.buffer.data), self.resampled.settled())

    def _buffer_full(self) -> EventError:
        return EventError(
            f"the input audio buffer is full ({self.core.config.realtime_max_buffer_seconds:g} s): "
            "commit or clear it",
            code="input_audio_buffer_full",
        )

    async def clear(self) -> None:
        await self.responder.drop_speculation(UNUSED)
        self.buffer.clear()
        self.work_ahead.restart()
        if self.detector is not None:
            self.detector.reset()
        self.turn_item_id = None
        await self.send("input_audio_buffer.cleared")

    async def speech_started(self, sample: int) -> None:
        """The server VAD heard a turn begin at stream `sample`: with interrupt_response, the
        running response stops first (a barge-in)."""
        td = self.config.turn_detection
        assert td is not None
        await self.responder.drop_speculation(RESUMED)
        self.turn_item_id = new_id("item")
        self.buffer.keep_from(sample - td.prefix_padding_ms * INPUT_RATE // 1000)
        self.work_ahead.restart()
        response = self.responder.response
        # Stopped before speech_started is queued: none of its audio can follow that event.
        barge_in = td.interrupt_response and response is not None and response.stop("turn_detected")
        await self.send(
            "input_audio_buffer.speech_started", audio_start_ms=ms_of(sample), item_id=self.turn_item_id
        )
        if barge_in:
            assert response is not None
            self.on_barge_in()
            await response.wait()

    def speech_paused(self, sample: int) -> None:
        """The speech has paused since stream `sample` long enough that the turn may end there:
        its answer is started, held, on the audio a commit at `sample` would hold, when the
        decision would start one."""
        td = self.config.turn_detection
        modalities = self.core.deployment.input_modalities
        if td is None or not td.create_response or self.responder.busy:
            return
        if modalities is not None and "audio" not in modalities:
            return
        pcm, start = self.buffer.peek(sample), self.buffer.start
        if len(pcm) // 2 < MIN_COMMIT_MS * INPUT_RATE // 1000:
            return
        self.responder.speculate(sample, pcm, lambda: self._decoded(start, pcm, None))

    async def speech_stopped(self, sample: int) -> None:
        """The server VAD heard the turn end at stream `sample`: it is committed, and with
        create_response answered unless a response is running."""
        td = self.config.turn_detection
        assert td is not None
        decided = time.monotonic()
        item_id = self.turn_item_id or new_id("item")
        await self.send("input_audio_buffer.speech_stopped", audio_end_ms=ms_of(sample), item_id=item_id)
        try:
            committed = await self.commit(sample, None, item_id, (td.type, decided))
            if committed and td.create_response and not self.responder.busy:
                await self.responder.start(None)  # takes the speculation made of this turn
        except EventError as exc:
            if exc.code != "input_audio_buffer_commit_empty":
                raise
            # a blip too short to be a turn: dropped, not the client's error
        finally:
            await self.responder.drop_speculation(UNUSED)

    async def commit(
        self,
        until: int | None,
        event_id: str | None,
        item_id: str | None = None,
        detected: tuple[str, float] | None = None,
    ) -> bool:
        """The buffer's audio up to stream sample `until` (all when None: input_audio_buffer.commit)
        as a user item, decoded before it joins the conversation. `detected`: the turn detection
        that decided it and when (None: the client's commit, now)."""
        detection, decided = detected or (CLIENT_COMMIT, time.monotonic())
        ended = self.buffer.arrived_at(self.buffer.end if until is None else until)
        spoken = None if ended is None else SpokenTurn(detection, ended, decided)
        end = self.buffer.end if until is None else min(until, self.buffer.end)
        start = self.buffer.start
        pcm = self.buffer.take(until)
        self.work_ahead.restart()
        if self.detector is not None and until is None:
            self.detector.reset()
        self.turn_item_id = None
        # The speculation made of exactly this audio gives its decoding (a client's commit: none)
        speculation = await self.responder.speculation_for(end, pcm) if detected else None
        if speculation is None:
            await self.responder.drop_speculation(UNUSED)
        if len(pcm) // 2 < MIN_COMMIT_MS * INPUT_RATE // 1000:
            raise EventError(
                f"the input audio buffer holds {ms_of(len(pcm) // 2)} ms; "
                f"at least {MIN_COMMIT_MS} ms are needed",
                code="input_audio_buffer_commit_empty",
                event_id=event_id,
            )
        check_modality(self.core.deployment.input_modalities, "audio", "input_audio_buffer")
        item_id = item_id or new_id("item")
        parts = await speculation.parts() if speculation is not None else None
        if parts is None:
            parts = await self._decoded(start, pcm, event_id)
        item = Item(
            item_id,
            "user",
            parts,
            [{"type": "input_audio", "transcript": None}],
            audio_seconds=len(pcm) / 2 / INPUT_RATE,
            spoken=spoken,
        )
        previous = self.conversation.last_id()
        await self.send("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id)
        await self.add_item(item, previous)
        if self.config.transcription is not None:
            self.transcriber.start(item, self.config.transcription)
        return True

    async def _decoded(self, start: int, pcm: bytes, event_id: str | None) -> Parts:
        """A turn's pcm16 (from stream sample `start`) as its item's parts: its audio resampled for
        the thinker, as the media decoder decodes it, within the media limits it keeps."""
        samples = self.resampled.turn(start, pcm)
        if samples is None:  # not streamed: resampled whole, off the event loop
            samples = await asyncio.to_thread(resample_whole, pcm)
        try:
            self.core.media.check_audio(wav_size(pcm), samples.size, "input_audio_buffer")
        except OmniError as exc:
            raise EventError.of(exc, event_id) from None
        return [{"type": "audio", "audio": settled(AudioInput(samples))}]
