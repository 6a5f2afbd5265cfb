"""The stage chain, declared once: thinker -> talker -> code2wav.

Both runners of a request use this module: the in-process pipeline (engines in one process) and the
gateway's wiring (three gRPC streams). What they share is written here and nowhere else:

- which stages a request needs (`stages_for`),
- what each stage is opened with (`StageOpens`, from the request and its chunk plan),
- what an output of one stage becomes as input of the next (`TalkerFeed`, `CodecFeed`),
- the sequential-mode hold (`InputHold`): the receiving stage keeps its input until the last piece
  arrives, then takes all of it at once. Senders always forward as they go, so both modes share one
  path and differ only in when the receiver starts.

Torch-free on purpose (the gateway imports it): codec frames are whatever tensor type the runner
uses, and only merging held frames needs torch, imported where it happens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from omnistream.request.chunk_plan import ChunkPlan
from omnistream.request.generation import GenerationRequest
from omnistream.request.media import MediaLayout
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.structured import StructuredOutput

THINKER, TALKER, CODE2WAV = "thinker", "talker", "code2wav"
STAGES = (THINKER, TALKER, CODE2WAV)

T = TypeVar("T")


def stages_for(request: GenerationRequest) -> tuple[str, ...]:
    """The stages a request runs through: text alone needs only the thinker."""
    return STAGES if request.return_audio else (THINKER,)


@dataclass(frozen=True)
class ThinkerParams:
    max_tokens: int = 256
    ignore_eos: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    use_audio_in_video: bool = False  # how the prompt's video parts are heard (prompt building)
    # Speech: the thinker does not generate, it streams this text (tokenized as plain text) as its
    # output, so the talker speaks exactly it (see ThinkerOpen.assistant_text).
    assistant_text: str | None = None
    cache_scope: bytes = b""  # the prefix cache's scope (ThinkerOpen.cache_scope): b"" the shared one
    # The grammar the output follows (ThinkerOpen.structured_output); None: free text.
    structured_output: StructuredOutput | None = None
    background: bool = False  # steps only when no other request can (ThinkerOpen.background)
    # Work ahead: its media's whole audio windows encoded and kept, no answer (ThinkerOpen.encode_only).
    encode_only: bool = False
    # A request resumed after its replica was lost: the answer so far, which it continues
    # (ThinkerOpen.answer_ids; omnistream/chain/resume.py).
    answer_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class TalkerParams:
    speaker: str = ""  # "": the model's default voice (the talker's `default_speaker`)
    max_frames: int = 4096
    sampling: SamplingParams = field(default_factory=SamplingParams)
    ignore_eos: bool = False  # exactly max_frames: the end-of-speech code is never chosen
    cache_scope: bytes = b""  # the prefix cache's scope (TalkerOpen.cache_scope)


@dataclass(frozen=True)
class StageOpens:
    """What each stage of one request is opened with; talker/plan are None for a text-only request.

    `mode` is how the downstream stages take their input (see `InputHold`); the thinker always
    streams, since its consumer (the client, or the next stage's hold) decides what to do with it.
    """

    thinker: ThinkerParams
    talker: TalkerParams | None
    plan: ChunkPlan | None  # the talker ships frames by it, code2wav decodes windows by it
    mode: str


def stage_opens(request: GenerationRequest, plan: ChunkPlan | None) -> StageOpens:
    audio = TALKER in stages_for(request)
    talker = TalkerParams(
        request.speaker,
        request.max_audio_frames,
        request.talker_sampling,
        request.ignore_eos,
        request.cache_scope,
    )
    return StageOpens(
        thinker=ThinkerParams(
            request.max_tokens,
            request.ignore_eos,
            request.sampling,
            request.use_audio_in_video,
            request.assistant_text,
            request.cache_scope,
            request.structured_output,
            request.background,
            request.encode_only,
        ),
        talker=talker if audio else None,
        plan=plan if audio else None,
        mode=request.mode,
    )


@dataclass
class TalkerFeed:
    """One thinker output as talker input: the first carries the prompt the thinker ran."""

    token_ids: list[int]
    last: bool
    prompt_ids: list[int] | None = None
    multimodal_hidden: Mapping[int, Any] | None = None  # prompt position -> deep hidden row
    media_layout: MediaLayout | None = None  # with the prompt, when it has media

    @staticmethod
    def merge(held: Sequence[TalkerFeed]) -> TalkerFeed:
        prompt_ids = [p for f in held for p in f.prompt_ids or ()]
        given = [f.multimodal_hidden for f in held if f.multimodal_hidden]
        # The prompt's rows as they came (one feed has them), else one mapping of them all.
        hidden = given[0] if len(given) == 1 else {p: row for rows in given for p, row in rows.items()}
        return TalkerFeed(
            token_ids=[t for f in held for t in f.token_ids],
            last=any(f.last for f in held),
            prompt_ids=prompt_ids or None,
            multimodal_hidden=hidden or None,
            media_layout=next((f.media_layout for f in held if f.media_layout is not None), None),
        )


@dataclass
class CodecFeed:
    """Codec frames as Code2Wav input: [codebooks, n] (n may be 0 when only `last` is news)."""

    codes: Any | None
    first_frame: int
    last: bool

    @property
    def frames(self) -> int:
        return 0 if self.codes is None else int(self.codes.shape[1])

    @staticmethod
    def merge(held: Sequence[CodecFeed]) -> CodecFeed:
        pieces = [f.codes for f in held if f.codes is not None and f.frames]
        codes: Any | None
        if len(pieces) > 1:
            import torch  # only a stage process merges frames, and it has torch

            codes = torch.cat(pieces, dim=1)
        else:
            codes = pieces[0] if pieces else None
        return CodecFeed(codes, held[0].first_frame if held else 0, any(f.last for f in held))


class InputHold(Generic[T]):
    """The receiving end of an edge: in async mode every piece passes at once; in sequential mode
    pieces are held and released, merged into one, with the last."""

    def __init__(self, mode: str, merge: Callable[[Sequence[T]], T]) -> None:
        self.sequential = mode == "sequential"
        self._merge = merge
        self._held: list[T] = []

    def push(self, piece: T, last: bool) -> list[T]:
        """The pieces to feed now (none while holding)."""
        if not self.sequential:
            return [piece]
        self._held.append(piece)
        if not last:
            return []
        merged, self._held = self._merge(self._held), []
        return [merged]
