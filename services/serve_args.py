"""Command-line arguments of `omnistream serve` (no heavy imports)."""

from __future__ import annotations

import argparse
import os

from omnistream.engine.load_options import DEFAULT_MAX_BATCH, DEFAULT_PREFILL_CHUNK, add_dtype_arguments
from omnistream.engine.playout import DEFAULT_FIRST_AUDIO_TARGET_S
from omnistream.request.chunk_plan import DEFAULT_CODE2WAV_STEP_FRAMES
from omnistream.service.cpu_priority import MAX_NICE

MODEL_ENV = "OMNISTREAM_MODEL"


def positive_int(text: str) -> int:
    """argparse type of a count that must be at least 1 (a clear usage error, not a crash later)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=os.environ.get(MODEL_ENV),
        required=not os.environ.get(MODEL_ENV),
        help=f"checkpoint directory (default: ${MODEL_ENV})",
    )
    p.add_argument(
        "--served-model-name",
        default="qwen3-omni",
        help="the model's name in this stage's Info, which the gateway reports to clients; every "
        "stage of a deployment must use the same one (default: qwen3-omni)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    add_dtype_arguments(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on stdout)")
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--metrics-port", type=int, default=0)
    p.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=DEFAULT_PREFILL_CHUNK,
        help="thinker and talker: prompt positions prefilled per step, all requests together; a long "
        "prompt then delays the running requests' next token by one such piece at a time "
        f"(default: {DEFAULT_PREFILL_CHUNK})",
    )
    p.add_argument("--max-requests", type=int, default=None, help="concurrency backstop (default 4x batch)")
    p.add_argument("--max-message-bytes", type=int, default=16 * 1024 * 1024)
    p.add_argument("--grace-seconds", type=float, default=30.0)
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (0: torch's default). One is fastest for small models on a shared CPU.",
    )
    p.add_argument(
        "--nice",
        type=nice_value,
        default=0,
        help="run this stage at a lower CPU priority (0-19) where stages share cores: the others get "
        "the cores first while they are contended (omnistream/service/cpu_priority.py; "
        "`omnistream up` runs the thinker at 5). Default: 0",
    )
    p.add_argument("--tls-cert", default=None, help="PEM certificate: serve gRPC over TLS")
    p.add_argument("--tls-key", default=None, help="PEM private key of --tls-cert")
    p.add_argument(
        "--tls-client-ca", default=None, help="PEM CA: require client certificates signed by it (mTLS)"
    )


def nice_value(text: str) -> int:
    """argparse type of `--nice`: a nice value a process may take without privilege."""
    value = int(text)
    if not 0 <= value <= MAX_NICE:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_NICE}], got {value}")
    return value


def non_negative_seconds(text: str) -> float:
    """argparse type of a duration in seconds that may be zero but not negative."""
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text}")
    return value


def _add_first_audio_target(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--first-audio-target",
        type=non_negative_seconds,
        default=DEFAULT_FIRST_AUDIO_TARGET_S,
        help="seconds after a request arrives by which its first audio is due: when a step cannot "
        "take every request, those closest to running out of audio go first, and a request "
        "without audio yet counts as running out at this time "
        f"(default: {DEFAULT_FIRST_AUDIO_TARGET_S})",
    )


def add_talker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only the talker takes: the other stages reject them instead of ignoring them."""
    p.add_argument(
        "--max-step-batch",
        type=positive_int,
        default=None,
        help="requests that take a codec frame per step, at most --max-batch; when more are ready, "
        "those with the least buffered audio go first and the rest wait a step "
        "(default: --max-batch, every request with a KV slot)",
    )
    _add_first_audio_target(p)
    p.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="capture the talker frame's two steps (with --no-static-frames: the code predictor's 15) "
        "as CUDA graphs, once per batch bucket (and KV width), and replay them: a few replays per "
        "frame instead of thousands of launches. Each graph is checked against its eager run when "
        "captured; one that differs or fails to capture runs eagerly (logged). Default: on for a "
        "CUDA --device, off elsewhere (asked for off CUDA: refused)",
    )
    p.add_argument(
        "--static-frames",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run each talker frame as two fixed-shape steps (the code predictor's 15 codebooks, "
        "the talker's decode step, each with its sampling); the same codes as the eager frame "
        "(default: on; --no-static-frames: the eager frame, dynamic shapes)",
    )


def add_thinker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only the thinker takes: the other stages reject them instead of ignoring them."""
    p.add_argument(
        "--backend",
        choices=("transformers", "vllm"),
        default="transformers",
        help="the thinker's engine: transformers (default; text, audio, images, video) or vllm "
        "(vLLM's async engine: continuous batching, prefix caching; text prompts only, its Info says "
        "so; run with the vLLM environment's python, see `make setup-vllm`)",
    )
    p.add_argument(
        "--vllm-load",
        choices=("auto", "text", "native"),
        default="auto",
        help="with --backend vllm: text (the thinker's language model converted to a "
        "Qwen3MoeForCausalLM directory beside the checkpoint), native (the checkpoint itself, "
        "through vLLM's Qwen3-Omni thinker), or auto (default: native on cuda, text on cpu)",
    )


def add_code2wav_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only Code2Wav takes: the other stages reject them instead of ignoring them."""
    p.add_argument(
        "--max-step-frames",
        type=positive_int,
        default=DEFAULT_CODE2WAV_STEP_FRAMES,
        help="codec frames decoded per step, all its windows together (the most urgent window "
        "always goes); with --max-batch windows per step, the windows of the requests with the "
        "least buffered audio go first and the rest wait a step. A step's time grows with its "
        "frames, so the bound is how long an urgent window may wait behind others "
        f"(default {DEFAULT_CODE2WAV_STEP_FRAMES}: four 25-frame windows)",
    )
    _add_first_audio_target(p)


def load_options_refusal(args: argparse.Namespace) -> str | None:
    """Why these serve arguments cannot load, said before any weight is read; None if they can."""
    if getattr(args, "cuda_graphs", None) and args.device.split(":")[0] != "cuda":
        return f"--cuda-graphs needs a CUDA --device (e.g. cuda or cuda:0), got {args.device!r}"
    step_batch = getattr(args, "max_step_batch", None)
    if step_batch is not None and step_batch > args.max_batch:
        return f"--max-step-batch {step_batch} exceeds --max-batch {args.max_batch}"
    return None


def schedule_options(args: argparse.Namespace) -> dict:
    """The per-step scheduling options of the stage's flags, as the family's `engine(...)` takes
    them (a stage without a flag gets the factory's default)."""
    names = ("max_step_batch", "max_step_frames", "first_audio_target")
    return {name: getattr(args, name) for name in names if hasattr(args, name)}
