"""The gateway core with audio a thinker replica holds for a scope: a realtime turn's history audio
goes as its digest once the replica accepted it, and a replica that lost it (`media_expired`) gets
the same request again with the samples, on the same replica, unseen by the client.

Fake thinker stubs stand in for the replica's channel (no stage runs); the core, its replica set,
the session and `run_stages` are the real ones."""

from __future__ import annotations

import grpc
import numpy as np

from gateway.config import GatewayConfig
from gateway.serving.core import GatewayCore
from omnistream.proto.omni.v1 import stage_pb2
from omnistream.request.generation import DoneEvent, GenerationRequest
from omnistream.request.media import AudioInput, audio_digest
from omnistream.service.server import ERROR_KIND_METADATA_KEY, STAGE_ORIGIN, STATUS_ORIGIN_METADATA_KEY
from tests.unit.gateway.infos import stage_info
from tests.unit.gateway.serving.test_core_link_failure import (
    FakeCall,
    FakeHealth,
    close,
    in_flight,
    rpc_error,
)

EXPIRED = rpc_error(
    grpc.StatusCode.FAILED_PRECONDITION,
    "the thinker no longer holds that audio; send its samples",
    ((ERROR_KIND_METADATA_KEY, "media_expired"), (STATUS_ORIGIN_METADATA_KEY, STAGE_ORIGIN)),
)


class RecordingCall(FakeCall):
    """A thinker stream that keeps the open it was sent and answers one chunk, or fails."""

    def __init__(self, opens: list, error) -> None:
        super().__init__(error)
        self.opens = opens

    async def write(self, message) -> None:
        self.opens.append(message.open)


class RecordingThinker:
    def __init__(self, errors: list) -> None:
        self.errors, self.opens = errors, []

    async def Info(self, request, timeout=None):
        return stage_info("thinker", input_modalities=["text", "audio"])

    def Stream(self, timeout=None) -> RecordingCall:
        return RecordingCall(self.opens, self.errors.pop(0) if self.errors else None)


async def one_thinker(errors: list) -> tuple[GatewayCore, RecordingThinker, str]:
    core = GatewayCore(GatewayConfig(thinker=["127.0.0.1:1"]))
    (replica,) = core.replicas.sets["thinker"].replicas
    replica.health, replica.stub = FakeHealth(), RecordingThinker(errors)
    await core.replicas.check_all()
    return core, replica.stub, replica.address


def turn(audio: list[AudioInput], scope: bytes = b"session") -> GenerationRequest:
    parts = [{"role": "user", "content": [{"type": "audio", "audio": a}]} for a in audio]
    return GenerationRequest(
        messages=parts, return_audio=False, max_audio_frames=8, cache_scope=scope, refer_audio=True
    )


def sent(open_: stage_pb2.ThinkerOpen) -> list[str]:
    """Each audio part of an open: "digest" or "samples"."""
    return ["digest" if m.parts[0].audio.digest else "samples" for m in open_.messages]


def clip(seed: int) -> AudioInput:
    return AudioInput(np.random.default_rng(seed).standard_normal(1600).astype(np.float32))


async def run(core: GatewayCore, request: GenerationRequest) -> list:
    session = await core.open(request)
    return [event async for event in session.events()]


async def test_audio_the_replica_accepted_goes_as_its_digest_in_the_scopes_later_turns():
    core, thinker, _ = await one_thinker([])
    first, second = clip(1), clip(2)
    try:
        await run(core, turn([first]))
        await run(core, turn([first, second]))
        events = await run(core, turn([first, second, clip(3)]))
        assert isinstance(events[-1], DoneEvent)
        assert [sent(o) for o in thinker.opens] == [
            ["samples"],
            ["digest", "samples"],
            ["digest", "digest", "samples"],
        ]
        assert thinker.opens[1].messages[0].parts[0].audio.digest == audio_digest(first)
        await run(core, turn([first], scope=b"another session"))  # its own scope: nothing known
        core.sent_audio.release(b"session")  # the session ended
        await run(core, turn([first]))
        assert [sent(o) for o in thinker.opens[3:]] == [["samples"], ["samples"]]
    finally:
        await close(core)


async def test_a_request_that_does_not_ask_never_refers():
    core, thinker, address = await one_thinker([])
    audio = clip(1)
    try:
        core.sent_audio.confirm(b"session", address, turn([audio]).messages)
        plain = GenerationRequest(
            messages=turn([audio]).messages, return_audio=False, max_audio_frames=8, cache_scope=b"session"
        )
        await run(core, plain)
        assert sent(thinker.opens[0]) == ["samples"]
    finally:
        await close(core)


async def test_a_replica_that_lost_the_audio_gets_the_samples_again_and_the_client_its_answer():
    core, thinker, address = await one_thinker([EXPIRED])
    first = clip(1)
    try:
        core.sent_audio.confirm(b"session", address, turn([first]).messages)
        events = await run(core, turn([first, clip(2)]))
        assert isinstance(events[-1], DoneEvent)
        assert [sent(o) for o in thinker.opens] == [["digest", "samples"], ["samples", "samples"]]
        assert thinker.opens[1].request_id.endswith(".r1")  # a fresh id at the stage
        assert in_flight(core) == 0
        await run(core, turn([first]))  # known again from the accepted retry
        assert sent(thinker.opens[2]) == ["digest"]
    finally:
        await close(core)


async def test_expired_twice_is_the_error_not_a_loop():
    core, thinker, address = await one_thinker([EXPIRED, EXPIRED])
    try:
        core.sent_audio.confirm(b"session", address, turn([clip(1)]).messages)
        try:
            await run(core, turn([clip(1)]))
        except Exception as exc:  # the retry sent samples: a second refusal is the answer
            assert getattr(exc, "kind", None) == "media_expired"
        else:
            raise AssertionError("a second media_expired must reach the caller")
        assert len(thinker.opens) == 2 and in_flight(core) == 0
    finally:
        await close(core)
