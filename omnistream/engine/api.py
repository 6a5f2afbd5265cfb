"""The stage engine API as code: what every stage engine offers its servicer and the scaffolding.

`StageEngine` is what `ModelFamily.engine` returns and what `StageServicer`, `StageMetrics`, the speed
meter, `run_stage_server` and the family's warm-up hold, whichever class serves: the transformers
engines subclass `omnistream.engine.engine.Engine`, the vLLM thinker implements the same surface over
vLLM's own scheduler. The per-stage protocols add what that stage's servicer calls on top
(docs/architecture.md, "What a second engine for one stage of the same family implements").

Structural (`typing.Protocol`): an engine conforms by having the members, never by inheriting from
these classes; tests/unit/engine/test_api.py checks all four engines against them by signature, and
mypy checks the family's returns statically. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from omnistream.engine.chat_encoding import Tools
    from omnistream.engine.output_stream import OutputStream
    from omnistream.engine.stats import EngineStats
    from omnistream.engine.token_memo import TokenMemo
    from omnistream.request.chunk_plan import ChunkPlan
    from omnistream.request.media import MediaLayout
    from omnistream.request.stage_chain import TalkerFeed, TalkerParams, ThinkerParams
    from omnistream.request.structured import StructuredOutput

# `listener(engine, seconds)` after each step (metrics, the speed meter, heap trimming).
StepListener = Callable[[Any, float], None]
# `listener(error)` once, when the engine lost its device (the server then exits non-zero).
FatalListener = Callable[[BaseException], None]


class StageEngine(Protocol):
    """What every stage engine offers: its limits, its lifecycle and its request bookkeeping."""

    name: str  # the stage ("thinker", "talker", "code2wav"): thread names, logs, errors
    max_batch: int  # requests that hold model state at once (KV slots, one step's batch)
    max_requests: int  # requests admitted at once, waiting ones included
    stats: EngineStats  # per-step numbers, read from any thread
    poisoned: BaseException | None  # set once a step lost the device: the engine stopped

    @property
    def config(self) -> Any:
        """The checkpoint's configuration object (`describe_loaded(engine.config)` gives its Info)."""
        ...

    @property
    def num_requests(self) -> int: ...

    def start(self) -> None:
        """Begin stepping (weights are loaded by the constructor)."""
        ...

    def stop(self) -> None:
        """End every request and the stepping."""
        ...

    def add_request(self, request_id: str, *args: Any, **kwargs: Any) -> OutputStream[Any]:
        """Admit a request; its outputs come through the returned stream (the stage's own inputs:
        see the per-stage protocols)."""
        ...

    def abort(self, request_id: str, output: OutputStream[Any] | None = None) -> bool:
        """Forget the request now (only the one owning `output`, when given); False if unknown."""
        ...

    def wake(self) -> None:
        """Tell the stepping that room or input arrived."""
        ...

    def has_request(self, request_id: str) -> bool: ...

    def request_ids(self) -> list[str]: ...

    def counts(self) -> tuple[int, int]:
        """(running, waiting) right now."""
        ...

    def add_step_listener(self, listener: StepListener) -> None: ...

    def add_fatal_listener(self, listener: FatalListener) -> None: ...


class FrameShipping(Protocol):
    """Collects a request's codec frames and hands out each batch to ship, by its chunk plan."""

    frames: list[list[int]]

    def due(self, finished: bool) -> bool:
        """Is it time to ship what has not been shipped yet?"""
        ...

    def take(self) -> tuple[int, Any]:
        """(index of the first frame, the frames not shipped yet as [codebooks, n]), marked shipped."""
        ...


class ThinkerStageEngine(StageEngine, Protocol):
    """What `ThinkerServicer` calls on top (both thinker backends)."""

    max_model_len: int
    tokenizer: Any  # a Hugging Face tokenizer: which output ids are spoken (request/spoken.py)

    def encode_chat(
        self, messages: list[dict[str, Any]], tools: Tools = None, memo: TokenMemo | None = None
    ) -> list[int]:
        """The chat's prompt ids; `memo`: the scope's last prompt, so only what is new is tokenized."""
        ...

    def encode_assistant_text(self, text: str) -> list[int]: ...

    def prepare_media(
        self,
        messages: list[dict[str, Any]],
        use_audio_in_video: bool = False,
        tools: Tools = None,
        memo: TokenMemo | None = None,
        ahead: bool = False,
    ) -> Any:
        """`ahead`: the audio of a turn still spoken (encode_only), worked on for its commit."""
        ...

    async def compile_grammar(self, structured: StructuredOutput) -> Any:
        """The output grammar made ready off the event loop, within the engine's bound, for
        `add_request(grammar=...)`; InvalidRequest naming the client's param when it cannot be."""
        ...

    def add_request(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: ThinkerParams,
        media: Any = None,
        spoken: list[int] | None = None,
        grammar: Any = None,
    ) -> OutputStream[Any]: ...


class TalkerStageEngine(StageEngine, Protocol):
    """What `TalkerServicer` and the pipeline call on top."""

    max_model_len: int
    max_step_batch: int  # requests that take a frame step per step (the speed probe's largest batch)
    default_speaker: str

    def add_request(self, request_id: str, params: TalkerParams) -> OutputStream[Any]: ...

    def feed_piece(self, request_id: str, piece: TalkerFeed) -> None: ...

    def feed(
        self,
        request_id: str,
        token_ids: list[int],
        last: bool,
        prompt_ids: list[int] | None = None,
        multimodal_hidden: Mapping[int, Any] | None = None,
        media_layout: MediaLayout | None = None,
    ) -> None: ...


class Code2WavStageEngine(StageEngine, Protocol):
    """What `Code2WavServicer` and the pipeline call on top."""

    max_frames: int
    max_step_frames: int | None
    num_quantizers: int
    codebook_size: int
    sample_rate: int  # Hz of the audio it decodes

    @property
    def lookahead_frames(self) -> int:
        """Frames past a window's end its decode needs (the talker's shipper waits for them)."""
        ...

    def set_decode(self, decode: str) -> None:
        """ "stream" (exact, each window once) or "recompute" (the benchmark's baseline)."""
        ...

    def add_request(self, request_id: str, plan: ChunkPlan) -> OutputStream[Any]: ...

    def feed(self, request_id: str, codes: Any, last: bool) -> None: ...


STAGE_PROTOCOLS: dict[str, type[Any]] = {
    "thinker": ThinkerStageEngine,
    "talker": TalkerStageEngine,
    "code2wav": Code2WavStageEngine,
}

__all__: Sequence[str] = (
    "STAGE_PROTOCOLS",
    "Code2WavStageEngine",
    "FatalListener",
    "FrameShipping",
    "StageEngine",
    "StepListener",
    "TalkerStageEngine",
    "ThinkerStageEngine",
)
