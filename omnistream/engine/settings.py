"""A stage engine's settings: one typed, frozen object per stage, each field declared once.

Every field is a `setting(...)` (omnistream/engine/setting_field.py): its type, default and help are
written here and nowhere else. `omnistream serve <stage>` generates its flags from the stage's class
(services/serve_args.py), turns the parsed flags into the object once (`build` in
omnistream/service/settings.py), and hands it down: `family.engine(stage, model_dir, settings)`
gives it to the engine, which reads its fields. The pipeline, `omnistream up`, `generate` and the
benchmarks build the same objects, so no default is repeated down the chain.

    DeviceSettings              device, dtype, allow_float64       (load_options.py)
      EngineSettings            + max_batch, max_model_len, prefill_chunk, max_requests
        PrefixCacheSettings     + prefix_cache_gib                 (the thinker, the talker)
        AudioScheduleSettings   + first_audio_target               (the talker, Code2Wav)

    ThinkerEngineSettings   = PrefixCacheSettings + ThinkerLoadSettings (backend, vllm_load)
    TalkerEngineSettings    = PrefixCacheSettings + AudioScheduleSettings + max_step_batch
                              + TalkerLoadSettings (cuda_graphs, static_frames)
    Code2WavEngineSettings  = AudioScheduleSettings + max_step_frames + GraphSettings (cuda_graphs)

A stage's class holds only its own fields, as its flags do: `serve thinker --max-step-batch` is a
usage error, and the talker's settings have no backend. Torch-free: the CLI parses with it.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from omnistream.engine.load_options import (
    DeviceSettings,
    GraphSettings,
    TalkerLoadSettings,
    ThinkerLoadSettings,
)
from omnistream.engine.playout import DEFAULT_FIRST_AUDIO_TARGET_S
from omnistream.engine.setting_field import setting
from omnistream.request.chunk_plan import DEFAULT_CODE2WAV_STEP_FRAMES

GIB = 1 << 30
REQUESTS_PER_SLOT = 4  # requests a stage holds per KV slot when --max-requests is not given


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (a clear usage error, not a crash later)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_gib(text: str) -> float:
    """argparse type of a size in GiB that may be zero but not negative."""
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a number of GiB >= 0, got {text}")
    return value


def non_negative_seconds(text: str) -> float:
    """argparse type of a duration in seconds that may be zero but not negative."""
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


@dataclass(frozen=True)
class EngineSettings(DeviceSettings):
    """What every stage's engine takes: where it loads, its batch and its length."""

    max_batch: int = setting(16, help="requests one engine step runs together")
    max_model_len: int = setting(4096, help="positions a request may take, prompt and output")
    # Prompt positions prefilled per engine step, all prefills of that step together: a long prompt
    # holds the running requests' decode for one such piece per step, not for its whole length.
    prefill_chunk: int = setting(
        512,
        parse=positive_int,
        help="thinker and talker: prompt positions prefilled per step, all requests together; a long "
        "prompt then delays the running requests' next token by one such piece at a time",
    )
    max_requests: int | None = setting(
        None,
        shown=f"{REQUESTS_PER_SLOT}x --max-batch",
        help="requests held at once, running and waiting (more get RESOURCE_EXHAUSTED); reported in "
        "Info, the gateway admits by it",
    )

    @property
    def request_limit(self) -> int:
        """Requests held at once: `max_requests`, or (not given) REQUESTS_PER_SLOT per KV slot."""
        return self.max_requests or self.max_batch * REQUESTS_PER_SLOT


@dataclass(frozen=True)
class PrefixCacheSettings(EngineSettings):
    """What the stages with a prefix cache (the thinker, the talker) add."""

    prefix_cache_gib: float | None = setting(
        None,
        parse=non_negative_gib,
        shown="half the KV cache",
        help="GiB of KV kept of earlier prompts (the thinker: and answers, with their deep rows), so "
        "that a prompt that starts as an earlier one did (a conversation's next turn) prefills only "
        "what is new; keyed by content, least recently used evicted first; 0: off. The thinker's "
        "vLLM backend uses vLLM's own prefix caching instead",
    )

    @property
    def prefix_cache_bytes(self) -> int | None:
        """The prefix cache's budget in bytes (None: the family's default, half the KV cache)."""
        return None if self.prefix_cache_gib is None else int(self.prefix_cache_gib * GIB)


@dataclass(frozen=True)
class AudioScheduleSettings(EngineSettings):
    """What the audio stages' per-step scheduling adds (the talker's and Code2Wav's)."""

    first_audio_target: float = setting(
        DEFAULT_FIRST_AUDIO_TARGET_S,
        parse=non_negative_seconds,
        help="seconds after a request arrives by which its first audio is due: when a step cannot "
        "take every request, those closest to running out of audio go first, and a request "
        "without audio yet counts as running out at this time",
    )


@dataclass(frozen=True)
class TalkerScheduleSettings(AudioScheduleSettings):
    """The talker's frame rows per step."""

    max_step_batch: int | None = setting(
        None,
        parse=positive_int,
        shown="--max-batch, every request with a KV slot",
        help="requests that take a codec frame per step, at most --max-batch; when more are ready, "
        "those with the least buffered audio go first and the rest wait a step",
    )


@dataclass(frozen=True)
class ThinkerEngineSettings(ThinkerLoadSettings, PrefixCacheSettings):
    """The thinker's engine (ours or vLLM's)."""


@dataclass(frozen=True)
class TalkerEngineSettings(TalkerLoadSettings, TalkerScheduleSettings, PrefixCacheSettings):
    """The talker's engine."""


@dataclass(frozen=True)
class Code2WavEngineSettings(GraphSettings, AudioScheduleSettings):
    """Code2Wav's engine."""

    max_step_frames: int = setting(
        DEFAULT_CODE2WAV_STEP_FRAMES,
        parse=positive_int,
        help="codec frames decoded per step, all its windows together (the most urgent window "
        "always goes); with --max-batch windows per step, the windows of the requests with the "
        "least buffered audio go first and the rest wait a step. A step's time grows with its "
        "frames, so the bound is how long an urgent window may wait behind others (the default is "
        "four 25-frame windows)",
    )


STAGE_SETTINGS: dict[str, type[EngineSettings]] = {
    "thinker": ThinkerEngineSettings,
    "talker": TalkerEngineSettings,
    "code2wav": Code2WavEngineSettings,
}

_Settings = TypeVar("_Settings", bound=DeviceSettings)


def derive(cls: type[_Settings], base: DeviceSettings, **fields: Any) -> _Settings:
    """`cls`'s settings carrying every field of `base` that `cls` has too (a LoadOptions' device
    and dtype; an EngineSettings' batch and lengths as well), then `fields` over them: one stage's
    settings from what several stages share (the pipeline's, a benchmark's)."""
    names = {f.name for f in dataclasses.fields(cls)}
    carried = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.name in names}
    return cls(**{**carried, **fields})


def stage_settings(stage: str, base: DeviceSettings, device: str | None = None) -> EngineSettings:
    """The `stage`'s settings from shared ones (`derive`), on `device` (None: `base`'s)."""
    if stage not in STAGE_SETTINGS:
        raise ValueError(f"unknown stage {stage!r}; stages are {tuple(STAGE_SETTINGS)}")
    return derive(STAGE_SETTINGS[stage], base).on(device)
