"""One request and the events it produces: the model every entry point speaks (gateway, pipeline,
CLI, benchmark). Torch-free on purpose, so the gateway is a small router that never loads a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnistream.request.chunk_plan import DEFAULT_SCHEDULE, SCHEDULES, ChunkPlan
from omnistream.request.errors import InvalidRequest
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.structured import StructuredOutput

MODES = ("async", "sequential")


@dataclass
class GenerationRequest:
    """A request with every knob decided. Entry points build it with
    `omnistream.request.defaults.resolve`, which applies the one table of defaults; the field
    defaults here are only the engines' plain fallbacks (greedy), for code and tests that spell out
    a request directly, e.g. to compare with the greedy reference."""

    # Chat turns: {"role": ..., "content": str | list of parts} (parts: see omnistream/request/media.py).
    # An assistant turn may hold its tool calls, `"tool_calls": [{"id": ..., "type": "function",
    # "function": {"name": ..., "arguments": JSON text}}]` (its content "" when it has no words); a
    # "tool" turn is a call's result: `"tool_call_id"` and its content.
    messages: list[dict[str, Any]] | None = None
    # The function tools the prompt offers (OpenAI's chat-completions objects, `{"type": "function",
    # "function": {"name", "description", "parameters"}}`), rendered by the chat template. None: none.
    tools: list[dict[str, Any]] | None = None
    prompt_ids: list[int] | None = None
    max_tokens: int = 256
    ignore_eos: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_audio: bool = True
    speaker: str = ""  # "": the model's default voice, chosen by the talker
    max_audio_frames: int = 4096
    talker_sampling: SamplingParams = field(default_factory=SamplingParams)
    initial_codec_chunk_frames: int | None = None  # None: chosen from load
    codec_chunk_frames: int = 25
    codec_left_context_frames: int = 25
    # How codec windows after the first are sized: "grow" (each as long as all before it, up to
    # codec_chunk_frames) or "fixed" (all codec_chunk_frames); see omnistream/request/chunk_plan.py.
    codec_chunk_schedule: str = DEFAULT_SCHEDULE
    mode: str = "async"
    # Video parts: also hear their sound track (placed with the frames, as the reference processor
    # does with use_audio_in_video / load_audio_from_video).
    use_audio_in_video: bool = False
    # Speech: the assistant's answer is this text, not generated (the thinker streams it tokenized
    # as its output; the talker speaks it). See ThinkerOpen.assistant_text.
    assistant_text: str | None = None
    # The prefix cache's scope (omnistream/engine/prefix_cache.py): b"" shares cached prefixes with
    # any request of the same content; a realtime session has its own, a secret the gateway keeps.
    cache_scope: bytes = b""
    # Send audio this scope already sent the same thinker replica as its digest, not its samples
    # (gateway/serving/sent_audio.py): the realtime session's turns, which re-send their history.
    refer_audio: bool = False
    # A grammar the thinker's output must follow (tool calls, response_format): see
    # omnistream/request/structured.py. None: free text.
    structured_output: StructuredOutput | None = None
    # Background work (a transcription of the user's audio): the thinker steps it only when no
    # other request can, so it never delays an answer (ThinkerOpen.background).
    background: bool = False
    # Work ahead (a realtime turn's audio while it is still spoken): the thinker encodes the
    # media's whole audio windows and keeps their rows for the request that will follow, and the
    # request ends answering nothing (ThinkerOpen.encode_only). Text only, one stage.
    encode_only: bool = False

    def validate(self) -> None:
        if self.mode not in MODES:
            raise InvalidRequest(f"mode must be one of {MODES}", field="mode")
        if (self.messages is None) == (self.prompt_ids is None):
            raise InvalidRequest("give exactly one of messages or prompt_ids", field="messages")
        if self.codec_chunk_schedule not in SCHEDULES:
            raise InvalidRequest(
                f"codec_chunk_schedule must be one of {', '.join(SCHEDULES)}", field="codec_chunk_schedule"
            )
        if self.assistant_text is not None and not self.assistant_text:
            raise InvalidRequest("the text to speak is empty", field="input")
        if self.structured_output is not None:
            self.structured_output.validate()

    def chunk_plan(self, initial: int) -> ChunkPlan:
        """This request's codec chunk plan with a first window of `initial` frames (the runner
        chooses it from load when the request left it open), validated."""
        return ChunkPlan(
            initial, self.codec_chunk_frames, self.codec_left_context_frames, self.codec_chunk_schedule
        ).validate()


@dataclass
class TextEvent:
    token_ids: list[int]
    delta: str


@dataclass
class CodesEvent:
    frame: int
    codes: list[int]


@dataclass
class AudioEvent:
    audio: np.ndarray
    first_sample: int
    sample_rate: int  # the model's (the code2wav's); no default: a request knows no model


@dataclass
class DoneEvent:
    prompt_ids: list[int]
    output_ids: list[int]
    finish_reason: str
    frames: int
    audio_samples: int
    ttft: float | None
    ttfp: float | None
    e2e: float
    cached_tokens: int = 0  # of the prompt's, taken from the thinker's prefix cache


Event = TextEvent | CodesEvent | AudioEvent | DoneEvent
