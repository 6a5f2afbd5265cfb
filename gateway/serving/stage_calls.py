"""Run one request through the three stage services: the gateway's data plane.

Opens one bidi stream per stage (stage_links.py) and runs the request's chain over them
(omnistream/chain/run.py, the same runner as the in-process pipeline's): each stage's chunks go to
the next as they arrive (the stages themselves hold input back in sequential mode, so both modes
share this path). Cancelling the consumer cancels all three calls, which aborts the request in every
stage at once. With `Siblings` (resume.py), a stage lost mid-stream goes on at a sibling: the chain
re-opens or replays and skips (omnistream/chain/resume.py), `GrpcResumer` opens the sibling's stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import grpc

from gateway.serving.resume import Siblings
from gateway.serving.stage_links import GrpcCode2Wav, GrpcTalker, GrpcThinker
from gateway.serving.tracing import StageCalls
from omnistream.chain.run import ChainRun
from omnistream.proto.omni.v1 import stage_pb2_grpc
from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.errors import OmniError
from omnistream.request.generation import AudioEvent, CodesEvent, DoneEvent, GenerationRequest, TextEvent
from omnistream.request.relay import Emit, relay
from omnistream.request.stage_chain import TALKER, StageOpens, stage_opens, stages_for
from omnistream.service.server import client_channel_options
from omnistream.wire.limits import MAX_MESSAGE_BYTES
from omnistream.wire.messages import Referrer


@dataclass
class StageStubs:
    """One request's stubs of the three stages (the generated stubs are untyped: `Any`)."""

    thinker: Any
    talker: Any
    code2wav: Any

    @classmethod
    def connect(
        cls, thinker: str, talker: str, code2wav: str, max_message_bytes: int = MAX_MESSAGE_BYTES
    ) -> StageStubs:
        opts = client_channel_options(max_message_bytes)
        channel = grpc.aio.insecure_channel
        return cls(
            stage_pb2_grpc.ThinkerServiceStub(channel(thinker, options=opts)),  # type: ignore[no-untyped-call]
            stage_pb2_grpc.TalkerServiceStub(channel(talker, options=opts)),  # type: ignore[no-untyped-call]
            stage_pb2_grpc.Code2WavServiceStub(channel(code2wav, options=opts)),  # type: ignore[no-untyped-call]
        )


async def run_stages(
    stubs: StageStubs,
    request: GenerationRequest,
    rid: str,
    plan: ChunkPlan,
    emit: Emit,
    timeout: float | None = None,
    with_codes: bool = False,
    trace: StageCalls | None = None,
    refer_audio: Referrer | None = None,
    siblings: Siblings | None = None,
) -> DoneEvent:
    """Run one request through the stages, handing each event to `emit` as it comes; returns the
    summary. `emit` is the request's one buffer (the gateway's per-client collector), so nothing
    queues between the stages and it. Codec frames become CodesEvents only `with_codes` (tests and
    tools that compare codes): a client never sees them, so the gateway does not decode them.
    `trace`: the CLIENT spans of the calls (gateway/serving/tracing.py), each call's `traceparent`
    in its metadata; ended here however the calls end. `refer_audio`: the audio parts the thinker
    replica holds for the request's scope, sent as their digests (gateway/serving/sent_audio.py).
    `siblings`: where a lost talker or Code2Wav may go on (None: a loss ends the request)."""
    request.validate()
    opens = stage_opens(request, plan)
    audio = TALKER in stages_for(request)

    def stream(stub: Any, stage: str, metadata: Any = None) -> Any:
        if trace is None:  # tracing off: the call as it always was
            return stub.Stream(timeout=timeout)
        return stub.Stream(timeout=timeout, metadata=metadata or trace.metadata(stage))

    # All three open at once: the thinker's prompt is under way while the audio stages accept
    # (a round trip each, ~4 ms of every request's TTFT when they came first).
    thinker = GrpcThinker(stream(stubs.thinker, "thinker"), rid, request, opens, refer_audio)
    talker = GrpcTalker(stream(stubs.talker, "talker"), rid, opens, with_codes) if audio else None
    code2wav = GrpcCode2Wav(stream(stubs.code2wav, "code2wav"), rid, opens) if audio else None
    resumer = (
        None if siblings is None else GrpcResumer(siblings, stream, trace, rid, request, opens, with_codes)
    )
    chain = ChainRun(thinker, talker, code2wav, emit, with_codes=with_codes, resumer=resumer)
    ended: BaseException | None = None
    try:
        return await chain.run()
    except BaseException as exc:
        ended = exc
        raise
    finally:
        if trace is not None:
            trace.end(ended, _call_results(chain))


class GrpcResumer:
    """The chain's Resumer (omnistream/chain/resume.py) over gRPC: a stream to the sibling that
    `Siblings` chose, under a request id of its own (the lost replica may still hold the old one:
    a cut link, not a dead process)."""

    def __init__(
        self,
        siblings: Siblings,
        stream: Any,
        trace: StageCalls | None,
        rid: str,
        request: GenerationRequest,
        opens: StageOpens,
        with_codes: bool,
    ) -> None:
        self._siblings, self._stream, self._trace = siblings, stream, trace
        self._rid, self._request, self._opens, self._with_codes = rid, request, opens, with_codes

    def _call(self, stage: str, error: OmniError) -> tuple[Any, str] | None:
        sibling = self._siblings.take(stage, error)
        if sibling is None:
            return None
        metadata = None if self._trace is None else self._trace.moved(stage, sibling.address, error)
        rid = f"{self._rid[:120]}.m{self._siblings.moves}"
        return self._stream(sibling.stub, stage, metadata), rid

    async def thinker(self, error: OmniError, answer_ids: list[int]) -> GrpcThinker | None:
        """The sibling gets the request's media as samples (it holds none of the scope's audio)."""
        call = self._call("thinker", error)
        if call is None:
            return None
        resumed = replace(self._opens.thinker, answer_ids=tuple(answer_ids))
        return GrpcThinker(call[0], call[1], self._request, replace(self._opens, thinker=resumed))

    async def talker(self, error: OmniError, start_frame: int) -> GrpcTalker | None:
        call = self._call("talker", error)
        if call is None:
            return None
        return GrpcTalker(call[0], call[1], self._opens, self._with_codes, start_frame)

    async def code2wav(self, error: OmniError) -> GrpcCode2Wav | None:
        call = self._call("code2wav", error)
        return None if call is None else GrpcCode2Wav(call[0], call[1], self._opens)

    def heard(self, stage: str, gap_s: float) -> None:
        self._siblings.heard(stage, gap_s)


def _call_results(chain: ChainRun) -> dict[str, dict[str, Any]]:
    """What each stage call produced, as its CLIENT span's attributes."""
    thinker: dict[str, Any] = {
        "gen_ai.usage.prompt_tokens": len(chain.prompt_ids),
        "gen_ai.usage.completion_tokens": len(chain.output_ids),
    }
    if chain.ttft is not None:
        thinker["gen_ai.latency.time_to_first_token"] = chain.ttft
    code2wav: dict[str, Any] = {"omnistream.audio.samples": chain.samples}
    if chain.ttfp is not None:
        code2wav["omnistream.audio.time_to_first_audio"] = chain.ttfp
    return {"thinker": thinker, "talker": {"omnistream.audio.frames": chain.frames}, "code2wav": code2wav}


async def run_request(
    stubs: StageStubs,
    request: GenerationRequest,
    rid: str,
    plan: ChunkPlan,
    timeout: float | None = None,
    with_codes: bool = False,
    refer_audio: Referrer | None = None,
) -> AsyncIterator[TextEvent | CodesEvent | AudioEvent | DoneEvent]:
    """`run_stages` as an iterator of events ending with the DoneEvent (tests and tools)."""

    async def body(emit: Emit) -> None:
        done = await run_stages(stubs, request, rid, plan, emit, timeout, with_codes, refer_audio=refer_audio)
        await emit(done)

    async for item in relay(body):
        yield item
