"""Command-line arguments of `omnistream serve` (no heavy imports).

Each stage's flags are generated from the settings dataclasses below (omnistream/service/settings.py):
a field's name dashed is its flag; its type, default and help are written once, beside it.
`StageSettings` holds what every stage takes; `ThinkerSettings`, `TalkerSettings` and
`Code2WavSettings` what only that stage takes (the other stages reject those flags instead of
ignoring them).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Literal

from omnistream.engine.load_options import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_CHUNK, add_dtype_arguments
from omnistream.engine.playout import DEFAULT_FIRST_AUDIO_TARGET_S
from omnistream.request.chunk_plan import DEFAULT_CODE2WAV_STEP_FRAMES
from omnistream.service.cpu_priority import MAX_NICE
from omnistream.service.settings import add_flags, setting, settings_of
from omnistream.service.tracing import ENDPOINT_HELP, ENDPOINT_SHOWN, endpoint_flag
from omnistream.wire.limits import MAX_MESSAGE_BYTES

MODEL_ENV = "OMNISTREAM_MODEL"


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (a clear usage error, not a crash later)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def nice_value(text: str) -> int:
    """argparse type of `--nice`: a nice value a process may take without privilege."""
    value = int(text)
    if not 0 <= value <= MAX_NICE:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_NICE}], got {value}")
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


@dataclass
class StageSettings:
    """What every stage takes."""

    model: str | None = setting(
        None, env=MODEL_ENV, required=True, metavar="DIR", help="checkpoint directory"
    )
    served_model_name: str = setting(
        "qwen3-omni",
        help="the model's name in this stage's Info, which the gateway reports to clients; every "
        "stage of a deployment must use the same one",
    )
    device: str = setting("cpu", help="cpu, cuda or cuda:N")
    # (--dtype and --allow-float64 follow: omnistream/engine/load_options.py, shared with `up`.)
    host: str = setting("127.0.0.1", help="address the gRPC port binds")
    port: int = setting(0, help="gRPC port; 0 picks a free port (printed on stdout)")
    metrics_host: str = setting("127.0.0.1", help="address the Prometheus /metrics port binds")
    metrics_port: int = setting(0, help="Prometheus /metrics port; 0 picks a free port")
    max_batch: int = setting(DEFAULT_MAX_BATCH, help="requests one engine step runs together")
    max_model_len: int = setting(4096, help="positions a request may take, prompt and output")
    prefill_chunk: int = setting(
        DEFAULT_PREFILL_CHUNK,
        parse=positive_int,
        help="thinker and talker: prompt positions prefilled per step, all requests together; a long "
        "prompt then delays the running requests' next token by one such piece at a time",
    )
    max_requests: int | None = setting(
        None,
        shown="4x --max-batch",
        help="requests held at once, running and waiting (more get RESOURCE_EXHAUSTED); reported in "
        "Info, the gateway admits by it",
    )
    max_message_bytes: int = setting(MAX_MESSAGE_BYTES, help="gRPC message limit, sent and received")
    grace_seconds: float = setting(30.0, help="seconds the open streams may take to finish on SIGTERM")
    threads: int = setting(
        1,
        help="torch intra-op threads (0: torch's default). One is fastest for small models on a shared CPU.",
    )
    nice: int = setting(
        0,
        parse=nice_value,
        help="run this stage at a lower CPU priority (0-19) where stages share cores: the others get "
        "the cores first while they are contended (omnistream/service/cpu_priority.py; "
        "`omnistream up` runs the thinker at 5)",
    )
    tls_cert: str | None = setting(None, help="PEM certificate: serve gRPC over TLS")
    tls_key: str | None = setting(None, help="PEM private key of --tls-cert")
    tls_client_ca: str | None = setting(None, help="PEM CA: require client certificates signed by it (mTLS)")
    otlp_traces_endpoint: str | None = setting(
        None, parse=endpoint_flag, metavar="URL", shown=ENDPOINT_SHOWN, help=ENDPOINT_HELP
    )


@dataclass
class AudioScheduleSettings:
    """What the audio stages' per-step scheduling shares (the talker's and Code2Wav's)."""

    first_audio_target: float = setting(
        DEFAULT_FIRST_AUDIO_TARGET_S,
        parse=non_negative_seconds,
        help="seconds after a request arrives by which its first audio is due: when a step cannot "
        "take every request, those closest to running out of audio go first, and a request "
        "without audio yet counts as running out at this time",
    )


@dataclass
class PrefixCacheSettings:
    """What the stages with a prefix cache (the thinker, the talker) share."""

    prefix_cache_gib: float | None = setting(
        None,
        parse=non_negative_gib,
        shown="half the KV cache",
        help="GiB of KV kept of earlier prompts (the thinker: and answers, with their deep rows), so "
        "that a prompt that starts as an earlier one did (a conversation's next turn) prefills only "
        "what is new; keyed by content, least recently used evicted first; 0: off. The thinker's "
        "vLLM backend uses vLLM's own prefix caching instead",
    )


@dataclass
class TalkerSettings(AudioScheduleSettings, PrefixCacheSettings):
    """What only the talker takes."""

    max_step_batch: int | None = setting(
        None,
        parse=positive_int,
        shown="--max-batch, every request with a KV slot",
        help="requests that take a codec frame per step, at most --max-batch; when more are ready, "
        "those with the least buffered audio go first and the rest wait a step",
    )
    cuda_graphs: bool | None = setting(
        None,
        shown="on for a CUDA --device, off elsewhere",
        help="capture the talker frame's two steps (with --no-static-frames: the code predictor's 15) "
        "as CUDA graphs, once per batch bucket (and KV width), and replay them: a few replays per "
        "frame instead of thousands of launches. Each graph is checked against its eager run when "
        "captured; one that differs or fails to capture runs eagerly (logged). Asked for off CUDA: refused",
    )
    static_frames: bool = setting(
        True,
        help="run each talker frame as two fixed-shape steps (the code predictor's 15 codebooks, "
        "the talker's decode step, each with its sampling); the same codes as the eager frame "
        "(--no-static-frames: the eager frame, dynamic shapes)",
    )


@dataclass
class ThinkerSettings(PrefixCacheSettings):
    """What only the thinker takes."""

    backend: Literal["transformers", "vllm"] = setting(
        "transformers",
        help="the thinker's engine: transformers (text, audio, images, video) or vllm "
        "(vLLM's async engine: continuous batching, prefix caching; text prompts only, its Info says "
        "so; run with the vLLM environment's python, see `make setup-vllm`)",
    )
    vllm_load: Literal["auto", "text", "native"] = setting(
        "auto",
        help="with --backend vllm: text (the thinker's language model converted to a "
        "Qwen3MoeForCausalLM directory beside the checkpoint), native (the checkpoint itself, "
        "through vLLM's Qwen3-Omni thinker), or auto (native on cuda, text on cpu)",
    )


@dataclass
class Code2WavSettings(AudioScheduleSettings):
    """What only Code2Wav takes."""

    max_step_frames: int = setting(
        DEFAULT_CODE2WAV_STEP_FRAMES,
        parse=positive_int,
        help="codec frames decoded per step, all its windows together (the most urgent window "
        "always goes); with --max-batch windows per step, the windows of the requests with the "
        "least buffered audio go first and the rest wait a step. A step's time grows with its "
        "frames, so the bound is how long an urgent window may wait behind others (the default is "
        "four 25-frame windows)",
    )


_BEFORE_DTYPE = ("model", "served_model_name", "device")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every stage's flags. A stage reads its namespace as parsed (no YAML lies under its flags),
    so an absent flag parses to its setting's default."""
    add_flags(p, StageSettings, names=_BEFORE_DTYPE, only_given=False)
    add_dtype_arguments(p)
    rest = [s.name for s in settings_of(StageSettings) if s.name not in _BEFORE_DTYPE]
    add_flags(p, StageSettings, names=rest, only_given=False)


def add_talker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only the talker takes."""
    add_flags(p, TalkerSettings, only_given=False)


def add_thinker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only the thinker takes."""
    add_flags(p, ThinkerSettings, only_given=False)


def add_code2wav_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only Code2Wav takes."""
    add_flags(p, Code2WavSettings, only_given=False)


def load_options_refusal(args: argparse.Namespace) -> str | None:
    """Why these serve arguments cannot load, said before any weight is read; None if they can."""
    if getattr(args, "cuda_graphs", None) and args.device.split(":")[0] != "cuda":
        return f"--cuda-graphs needs a CUDA --device (e.g. cuda or cuda:0), got {args.device!r}"
    step_batch = getattr(args, "max_step_batch", None)
    if step_batch is not None and step_batch > args.max_batch:
        return f"--max-step-batch {step_batch} exceeds --max-batch {args.max_batch}"
    return None


def schedule_options(args: argparse.Namespace) -> dict:
    """The per-step scheduling and cache options of the stage's flags, as the family's
    `engine(...)` takes them (a stage without a flag gets the factory's default)."""
    names = ("max_step_batch", "max_step_frames", "first_audio_target")
    options = {name: getattr(args, name) for name in names if hasattr(args, name)}
    gib = getattr(args, "prefix_cache_gib", None)
    if gib is not None:
        options["prefix_cache_bytes"] = int(gib * (1 << 30))
    return options


def stage_load_options(args: argparse.Namespace) -> dict:
    """The load options of the stage's own flags, as `LoadOptions` takes them (a stage without the
    flag gets LoadOptions' default: the thinker has no --cuda-graphs, the talker no --backend)."""
    names = ("cuda_graphs", "static_frames", "backend", "vllm_load")
    return {name: getattr(args, name) for name in names if hasattr(args, name)}
