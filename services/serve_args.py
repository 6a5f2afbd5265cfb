"""Command-line arguments of `omnistream serve` (no heavy imports).

Each stage's flags are generated from settings dataclasses (omnistream/service/settings.py): a
field's name dashed is its flag; its type, default and help are written once, beside it.
`StageSettings` below holds what the service process takes (its ports, TLS, threads); the engine's
settings are the stage's class in omnistream/engine/settings.py (`STAGE_SETTINGS`): what every
engine takes, then what only that stage takes (the other stages reject those flags instead of
ignoring them). `omnistream serve` builds both objects from the parsed flags, once
(services/serve.py), and hands them down.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from omnistream.engine.load_options import DeviceSettings, ExpertsLoadSettings, GraphSettings
from omnistream.engine.settings import STAGE_SETTINGS, EngineSettings, TalkerEngineSettings
from omnistream.service.cpu_priority import MAX_NICE
from omnistream.service.device_flags import add_dtype_arguments
from omnistream.service.settings import add_flags, setting, settings_of
from omnistream.service.tracing import ENDPOINT_HELP, ENDPOINT_SHOWN, endpoint_flag
from omnistream.wire.limits import MAX_MESSAGE_BYTES

MODEL_ENV = "OMNISTREAM_MODEL"


def nice_value(text: str) -> int:
    """argparse type of `--nice`: a nice value a process may take without privilege."""
    value = int(text)
    if not 0 <= value <= MAX_NICE:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_NICE}], got {value}")
    return value


@dataclass(frozen=True)
class StageSettings:
    """What every stage's service process takes (its engine's settings: omnistream/engine/settings.py)."""

    model: str | None = setting(
        None, env=MODEL_ENV, required=True, metavar="DIR", help="checkpoint directory"
    )
    served_model_name: str = setting(
        "qwen3-omni",
        help="the model's name in this stage's Info, which the gateway reports to clients; every "
        "stage of a deployment must use the same one",
    )
    host: str = setting("127.0.0.1", help="address the gRPC port binds")
    port: int = setting(0, help="gRPC port; 0 picks a free port (printed on stdout)")
    metrics_host: str = setting("127.0.0.1", help="address the Prometheus /metrics port binds")
    metrics_port: int = setting(0, help="Prometheus /metrics port; 0 picks a free port")
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


# The order of `serve --help`: the checkpoint and its name, where the engine loads, where the service
# listens, the engine's batch and lengths, the service's limits, then the stage's own flags.
_MODEL = ("model", "served_model_name")
_LISTEN = ("host", "port", "metrics_host", "metrics_port")
_LOAD = tuple(s.name for s in settings_of(DeviceSettings))  # device, dtype, allow_float64


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every stage's flags. A stage reads its namespace as parsed (no YAML lies under its flags),
    so an absent flag parses to its setting's default."""
    add_flags(p, StageSettings, names=_MODEL, only_given=False)
    add_flags(p, EngineSettings, names=("device",), only_given=False)
    add_dtype_arguments(p)  # --dtype, --allow-float64: the same flags as `up` and `generate`
    add_flags(p, StageSettings, names=_LISTEN, only_given=False)
    engine = [s.name for s in settings_of(EngineSettings) if s.name not in _LOAD]
    add_flags(p, EngineSettings, names=engine, only_given=False)
    rest = [s.name for s in settings_of(StageSettings) if s.name not in _MODEL + _LISTEN]
    add_flags(p, StageSettings, names=rest, only_given=False)


def add_stage_arguments(p: argparse.ArgumentParser, stage: str) -> None:
    """The flags only `stage`'s engine takes: its settings class's fields beyond EngineSettings'."""
    shared = {s.name for s in settings_of(EngineSettings)}
    own = [s.name for s in settings_of(STAGE_SETTINGS[stage]) if s.name not in shared]
    add_flags(p, STAGE_SETTINGS[stage], names=own, only_given=False)


def add_talker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only the talker takes."""
    add_stage_arguments(p, "talker")


def add_thinker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only the thinker takes."""
    add_stage_arguments(p, "thinker")


def add_code2wav_arguments(p: argparse.ArgumentParser) -> None:
    """Flags only Code2Wav takes."""
    add_stage_arguments(p, "code2wav")


def load_options_refusal(settings: DeviceSettings) -> str | None:
    """Why a stage with these settings cannot load, said before any weight is read (in its flags'
    words); None if it can."""
    graphs = isinstance(settings, GraphSettings) and settings.cuda_graphs  # the talker, Code2Wav
    if graphs and settings.device.split(":")[0] != "cuda":
        return f"--cuda-graphs needs a CUDA --device (e.g. cuda or cuda:0), got {settings.device!r}"
    if isinstance(settings, ExpertsLoadSettings) and settings.experts != "auto":
        if getattr(settings, "backend", "transformers") == "vllm":
            return (
                "--experts chooses the transformers engine's MoE kernel; vLLM brings its own (--backend vllm)"
            )
        if settings.experts == "grouped_mm" and settings.dtype_name == "float64":
            return "--experts grouped_mm does not run float64 (fixed or eager do)"
    if isinstance(settings, TalkerEngineSettings):
        step_batch = settings.max_step_batch
        if step_batch is not None and step_batch > settings.max_batch:
            return f"--max-step-batch {step_batch} exceeds --max-batch {settings.max_batch}"
    return None
