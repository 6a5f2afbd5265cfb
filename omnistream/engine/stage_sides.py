"""Each stage's own side of an edge, shared by its gRPC servicer and its in-process link.

The receiving end of an edge holds its input in sequential mode (`InputHold`), and the sending end
shapes what its engine produced into the pieces the next stage takes: the thinker's steps into
pieces with what of them is spoken, the talker's frames into windows of the chunk plan, Code2Wav's
windows into audio. A servicer puts these pieces on the wire; a local link hands them on as they are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from omnistream.request.stage_chain import CodecFeed, InputHold, TalkerFeed
from omnistream.request.stage_outputs import AudioOut, CodecOut, ThinkerOut

if TYPE_CHECKING:
    from omnistream.engine.api import Code2WavStageEngine, FrameShipping, TalkerStageEngine
    from omnistream.engine.output_stream import OutputStream
    from omnistream.request.spoken import SpokenFilter


async def thinker_pieces(
    out: OutputStream[Any], speech: SpokenFilter, prompt_ids: list[int], answer: Sequence[int] = ()
) -> AsyncIterator[ThinkerOut]:
    """The thinker's steps as pieces: each takes every step already there (a producer ahead of its
    reader ships several in one), says which of its tokens are spoken, and the first carries the
    prompt (with, for media, its deep rows and layout). A resumed request (`answer`: its answer so
    far) carries no prompt, its talker has it, and what is spoken continues from that answer."""
    speech.push(list(answer))  # what of it was spoken went already; a marker begun in it goes on
    first = not answer
    while steps := await out.get_batch():
        last = steps[-1]
        token_ids = [t for s in steps for t in s.token_ids]
        spoken = speech.push(token_ids)
        if last.finished:
            spoken += speech.finish()
        piece = ThinkerOut(
            token_ids=token_ids,
            text_delta="".join(s.text_delta for s in steps),
            finished=last.finished,
            finish_reason=last.finish_reason or "",
            spoken=spoken,
        )
        if first:
            head = steps[0]
            piece.prompt_ids = list(prompt_ids)
            piece.cached_tokens = head.cached_tokens
            if head.multimodal_positions:
                piece.multimodal_positions = list(head.multimodal_positions)
                piece.prompt_hidden = head.prompt_hidden
            piece.media_layout = head.media_layout
            first = False
        yield piece


class TalkerIntake:
    """The talker's receiving end: feeds, held in sequential mode, into its engine."""

    def __init__(self, engine: TalkerStageEngine, request_id: str, mode: str) -> None:
        self.engine, self.request_id = engine, request_id
        self._hold: InputHold[TalkerFeed] = InputHold(mode, TalkerFeed.merge)

    def push(self, feed: TalkerFeed) -> None:
        for piece in self._hold.push(feed, feed.last):
            self.engine.feed_piece(self.request_id, piece)


async def codec_chunks(out: OutputStream[Any], shipper: FrameShipping) -> AsyncIterator[CodecOut]:
    """The talker's frames as the chunks the plan ships: each as soon as Code2Wav can decode a
    window from it, and the end (with whatever frames are left)."""
    while steps := await out.get_batch():
        finished = False
        reason = ""
        for step in steps:
            if step.codes is not None:
                shipper.frames.append(step.codes)
            finished = finished or step.finished
            reason = step.finish_reason or reason
        if not shipper.due(finished):
            continue
        first_frame, codes = shipper.take()
        yield CodecOut(first_frame, int(codes.shape[1]), finished, reason, codes)


class CodecIntake:
    """Code2Wav's receiving end: frames, held in sequential mode, into its engine."""

    def __init__(self, engine: Code2WavStageEngine, request_id: str, mode: str) -> None:
        self.engine, self.request_id = engine, request_id
        self._hold: InputHold[CodecFeed] = InputHold(mode, CodecFeed.merge)

    def push(self, feed: CodecFeed) -> None:
        for piece in self._hold.push(feed, feed.last):
            self.engine.feed(self.request_id, piece.codes, piece.last)


async def audio_pieces(out: OutputStream[Any], sample_rate: int) -> AsyncIterator[AudioOut]:
    """Code2Wav's decoded windows, in order."""
    while pieces := await out.get_batch():
        for piece in pieces:
            yield AudioOut(piece.audio, piece.first_sample, sample_rate, piece.finished)
