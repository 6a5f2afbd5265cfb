"""The one place a request's defaults live: every entry point (REST, the gateway's gRPC API,
`omnistream generate`, the benchmark) maps its input to `RequestInput` and calls `resolve`.

Torch-free, like `omnistream.request.generation`: the gateway imports it and never loads a model.

Why these defaults (`DEFAULTS`; docs/serving.md has the same table):

* No system prompt. The public API is OpenAI's, where a system prompt is something the client sends
  (a "system" message, or `generate --system`); a hidden one would make the same messages mean
  different prompts through different doors, and a prompt_ids request could not take one anyway.
* Thinker: temperature 1.0, top_p 1.0, no top_k, no repetition penalty: OpenAI's defaults for
  `temperature`/`top_p`, so a client written for that API gets what it expects.
* Talker: temperature 0.9, top_k 50, top_p 1.0, repetition penalty 1.05: the reference
  implementation's (transformers' Qwen3-Omni `generate`) talker settings. The real voice is trained
  to be sampled; greedy codec decoding tends to loop or go flat.
* The talker's seed is the request's seed unless a talker seed is given, so one `seed` makes text
  and speech reproducible together.
* Voice: the model's default voice (ethan on Qwen3-Omni), as the talker reports it in its Info; a
  deployment that does not know it yet leaves the speaker empty, and the talker speaks its default.
* Codec chunk schedule "grow": after the first (small) codec window each window doubles up to the
  chunk size, so the next audio chunk is ready before what was sent has played out; "fixed" (all
  later windows full size, what peers did before) stalled most answers after the first syllable.
  It is a per-request knob so the two can be compared; the exact streaming Code2Wav makes the same
  audio either way.
* Token and frame limits, the codec chunking and async_chunk belong to the deployment (`ServingDefaults`:
  the gateway's flags, or the built-in values for the in-process CLI).

Greedy stays one explicit value away: temperature 0 (talker_temperature 0 for the voice).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from omnistream.request.chunk_plan import (
    DEFAULT_CHUNK_FRAMES,
    DEFAULT_LEFT_CONTEXT_FRAMES,
    DEFAULT_SCHEDULE,
)
from omnistream.request.errors import InvalidRequest
from omnistream.request.generation import GenerationRequest
from omnistream.request.sampling_params import SamplingParams
from omnistream.request.structured import StructuredOutput

ROLES = ("system", "user", "assistant", "tool")
# What a turn may hold besides its role and content (see GenerationRequest.messages).
TURN_FIELDS = ("tool_calls", "tool_call_id")


@dataclass(frozen=True)
class Defaults:
    """What a request gets for each knob its sender left out (see the module docstring for why)."""

    system_prompt: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    repetition_penalty: float = 1.0
    talker_temperature: float = 0.9
    talker_top_p: float = 1.0
    talker_top_k: int = 50
    talker_repetition_penalty: float = 1.05
    voice: str | None = None  # None: the model's default voice (`ServingDefaults.default_voice`)
    return_audio: bool = True
    ignore_eos: bool = False
    codec_chunk_schedule: str = DEFAULT_SCHEDULE  # "grow" or "fixed" (omnistream/request/chunk_plan.py)
    # The deployment's built-in values (`ServingDefaults` overrides them, e.g. from gateway flags).
    max_tokens: int = 256
    max_audio_frames: int = 2048
    codec_chunk_frames: int = DEFAULT_CHUNK_FRAMES
    codec_left_context_frames: int = DEFAULT_LEFT_CONTEXT_FRAMES
    async_chunk: bool = True
    use_audio_in_video: bool = False  # the reference processor's default


DEFAULTS = Defaults()


@dataclass(frozen=True)
class ServingDefaults:
    """What the serving side decides rather than the request: the gateway's flags, or the built-in
    values for the in-process pipeline. `voices` empty means "not known here" (the talker checks);
    `voice` is the model's default voice (the talker's Info), None when not known here."""

    max_tokens: int = DEFAULTS.max_tokens
    max_audio_frames: int = DEFAULTS.max_audio_frames
    codec_chunk_frames: int = DEFAULTS.codec_chunk_frames
    codec_left_context_frames: int = DEFAULTS.codec_left_context_frames
    async_chunk: bool = DEFAULTS.async_chunk
    voices: tuple[str, ...] = ()
    voice: str | None = None

    @classmethod
    def of(
        cls, config: Any, voices: Sequence[str] | None = None, default_voice: str | None = None
    ) -> ServingDefaults:
        """A gateway's: its config's flags (duck-typed: this module must not import the gateway,
        which imports it) and the voices and default voice its talkers reported in their Info
        (None: not known yet)."""
        return cls(
            max_tokens=config.default_max_tokens,
            max_audio_frames=config.max_audio_frames,
            codec_chunk_frames=config.codec_chunk_frames,
            codec_left_context_frames=config.codec_left_context_frames,
            async_chunk=bool(config.async_chunk),
            voices=tuple(voices or ()),
            voice=default_voice or None,
        )

    def default_voice(self, preferred: str | None = DEFAULTS.voice) -> str:
        """The voice of a request that names none: `preferred` (a table's configured voice) when this
        deployment has it (or its voices are unknown), else the model's default voice (ethan on
        Qwen3-Omni), else "" when that is not known here: the talker then speaks its default."""
        if preferred and (not self.voices or preferred.lower() in (v.lower() for v in self.voices)):
            return preferred
        return self.voice or ""


@dataclass(frozen=True)
class RequestInput:
    """What the sender gave, before defaults: None everywhere means "not given".

    Entry points only translate their wire format into this; they decide no defaults of their own.
    """

    # Content: a string, or a list of parts (omnistream/request/media.py; the gateway's media parts hold an
    # encoded file until `GatewayCore.open` decodes them).
    messages: Sequence[dict[str, Any]] | None = None
    prompt_ids: Sequence[int] | None = None
    system: str | None = None  # prepended as a system message (`generate --system`); "": none
    max_tokens: int | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    return_audio: bool | None = None
    voice: str | None = None
    max_audio_frames: int | None = None
    talker_temperature: float | None = None
    talker_top_p: float | None = None
    talker_top_k: int | None = None
    talker_repetition_penalty: float | None = None
    talker_seed: int | None = None
    initial_codec_chunk_frames: int | None = None  # None: chosen from load at run time
    codec_chunk_schedule: str | None = None  # "grow" or "fixed"
    async_chunk: bool | None = None
    use_audio_in_video: bool | None = None
    assistant_text: str | None = None  # speech: the answer to speak, not generated
    # vLLM's `cache_salt`: requests with the same salt share cached prefixes with each other only.
    cache_salt: str | None = None
    tools: Sequence[dict[str, Any]] | None = None  # the tools the prompt offers (GenerationRequest.tools)
    structured_output: StructuredOutput | None = None  # the grammar the answer follows


def cache_scope_of_salt(salt: str | None) -> bytes:
    """A client's cache salt as the stages' cache scope (16 bytes; b"": none given, the shared one).
    Hashed under a label of its own, so a salt is never some other scope (a realtime session's)."""
    if salt is None:
        return b""
    if not salt:
        raise InvalidRequest("cache_salt must not be empty", field="cache_salt")
    return hashlib.sha256(b"omnistream-cache-salt\0" + salt.encode()).digest()[:16]


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def _messages(given: RequestInput, defaults: Defaults) -> list[dict[str, Any]] | None:
    if given.messages is None:
        if given.system:
            raise InvalidRequest("a system prompt needs messages, not prompt_ids", field="system")
        return None
    messages = [
        {"role": m["role"], "content": m["content"]} | {k: m[k] for k in TURN_FIELDS if k in m}
        for m in given.messages
    ]
    for i, message in enumerate(messages):
        if message["role"] not in ROLES:
            raise InvalidRequest(
                f"messages[{i}].role must be system, user, assistant or tool", field="messages"
            )
    system = _given(given.system, defaults.system_prompt)
    if system == "":  # `--system ""`: no system message at all (not an empty one), whatever the table says
        system = None
    # The table's system prompt only fills in for a sender who gave none; an explicit one always goes.
    if system is not None and (given.system is not None or not any(m["role"] == "system" for m in messages)):
        messages.insert(0, {"role": "system", "content": system})
    return messages


def resolve(
    given: RequestInput, deployment: ServingDefaults = ServingDefaults(), defaults: Defaults = DEFAULTS
) -> GenerationRequest:
    """The request `given` asks for, every gap filled from `defaults` and `deployment`, validated.

    Checked here: what any entry point can get wrong on its own (prompt shape, roles, sampling
    bounds, positive counts). The deployment's limits (max_tokens, max_audio_frames, known voices,
    prompt size, the chunk plan) are enforced where the request runs (`GatewayCore.validate` and
    `chunk_plan`, the pipeline, the talker), so each keeps its order of checks and its error.
    """
    if (given.messages is None) == (given.prompt_ids is None):
        raise InvalidRequest("give exactly one of messages or prompt_ids", field="messages")
    messages = _messages(given, defaults)
    seed = given.seed
    sampling = SamplingParams(
        temperature=float(_given(given.temperature, defaults.temperature)),
        top_p=float(_given(given.top_p, defaults.top_p)),
        top_k=int(_given(given.top_k, defaults.top_k)),
        repetition_penalty=float(_given(given.repetition_penalty, defaults.repetition_penalty)),
        seed=seed,
    ).validate()
    talker = SamplingParams(
        temperature=float(_given(given.talker_temperature, defaults.talker_temperature)),
        top_p=float(_given(given.talker_top_p, defaults.talker_top_p)),
        top_k=int(_given(given.talker_top_k, defaults.talker_top_k)),
        repetition_penalty=float(_given(given.talker_repetition_penalty, defaults.talker_repetition_penalty)),
        seed=_given(given.talker_seed, seed),
    ).validate("talker_")
    max_tokens = _given(given.max_tokens, deployment.max_tokens)
    if max_tokens < 1:
        raise InvalidRequest("max_tokens must be at least 1", field="max_tokens")
    max_audio_frames = _given(given.max_audio_frames, deployment.max_audio_frames)
    if max_audio_frames < 1:
        raise InvalidRequest("max_audio_frames must be at least 1", field="max_audio_frames")
    async_chunk = _given(given.async_chunk, deployment.async_chunk)
    request = GenerationRequest(
        messages=messages,
        prompt_ids=None if given.prompt_ids is None else list(given.prompt_ids),
        max_tokens=max_tokens,
        ignore_eos=_given(given.ignore_eos, defaults.ignore_eos),
        sampling=sampling,
        return_audio=_given(given.return_audio, defaults.return_audio),
        speaker=given.voice or deployment.default_voice(defaults.voice),
        max_audio_frames=max_audio_frames,
        talker_sampling=talker,
        initial_codec_chunk_frames=given.initial_codec_chunk_frames,
        codec_chunk_frames=deployment.codec_chunk_frames,
        codec_left_context_frames=deployment.codec_left_context_frames,
        codec_chunk_schedule=_given(given.codec_chunk_schedule, defaults.codec_chunk_schedule),
        mode="async" if async_chunk else "sequential",
        use_audio_in_video=_given(given.use_audio_in_video, defaults.use_audio_in_video),
        assistant_text=given.assistant_text,
        cache_scope=cache_scope_of_salt(given.cache_salt),
        tools=None if given.tools is None else [dict(t) for t in given.tools],
        structured_output=given.structured_output,
    )
    request.validate()
    return request
