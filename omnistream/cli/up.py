"""`omnistream up`: the whole stack on one machine, each service its own process.

`up` owns its services for their whole life: SIGHUP (the terminal closed), SIGINT (Ctrl-C) and
SIGTERM all mean "stop": the gateway drains first, then the stages, also when the signal comes
while they are still starting. Should `up` die without that chance (SIGKILL, the OOM killer), the
services follow it by themselves (omnistream/cli/lifeline.py). A port that is already taken is
reported in one line before anything is started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import TextIO

from gateway.config import GatewayConfig
from omnistream.cli.launcher import (
    WAIT_STEP_S,
    ServiceProcess,
    StartCancelled,
    StartError,
    check_cancel,
    start_services,
    stop_services,
)
from omnistream.cli.usage import usage_text
from omnistream.engine.load_options import is_accelerator
from omnistream.engine.settings import (
    STAGE_SETTINGS,
    ThinkerEngineSettings,
    non_negative_gib,
    positive_int,
)
from omnistream.service.device_flags import add_dtype_arguments, add_stage_device_arguments, stage_devices
from omnistream.service.ports import in_use_message, port_in_use
from omnistream.service.settings import add_flags, as_flags, build, table
from omnistream.service.tracing import add_endpoint_argument
from services.serve_args import nice_value

STOP_SIGNALS = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
DRAIN_TIMEOUT_S = 40.0  # per group (gateway, then stages): their drain is 30 s, plus the server stop
VLLM_PYTHON_ENV = "OMNISTREAM_VLLM_PYTHON"
# The thinker's nice when the stages share this machine's cores (omnistream/service/cpu_priority.py).
DEFAULT_THINKER_NICE = 5
# GatewayConfig settings that `up` takes as flags of the same names: where it serves (and how many
# requests at once: unset, what the stages hold), and the admission settings it hands to
# `serve gateway` when given.
UP_GATEWAY_SETTINGS = ("host", "http_port", "grpc_port", "max_concurrency")
ADMISSION_SETTINGS = ("max_queue", "audio_hold_margin", "queue_timeout")
THINKER_BACKEND = table(ThinkerEngineSettings)[
    "backend"
]  # `serve thinker --backend`: its choices and default
# The stages' own defaults (omnistream/engine/settings.py), where `up`'s flags and keywords pass theirs on.
STAGE_DEFAULTS = ThinkerEngineSettings()


def vllm_python(given: str | None = None) -> str:
    """The interpreter a vLLM thinker runs with: `given`, $OMNISTREAM_VLLM_PYTHON, or this tree's
    .venv-vllm; StartError (before anything starts) when it does not exist."""
    from omnistream.models.qwen3_omni.thinker.vllm_launch import vllm_python_default

    path = given or os.environ.get(VLLM_PYTHON_ENV) or str(vllm_python_default())
    if not os.access(path, os.X_OK):
        raise StartError(
            f"the vLLM thinker needs the vLLM environment's python, and {path} is not one: "
            f"run `make setup-vllm`, or pass --vllm-python / set ${VLLM_PYTHON_ENV}"
        )
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True)
    add_dtype_arguments(p)
    p.add_argument(
        "--device",
        default=STAGE_DEFAULTS.device,
        help="every stage's device unless its own flag says (cpu, cuda:N)",
    )
    add_stage_device_arguments(p)
    # The gateway's own settings `up` passes on, with the gateway's defaults and help (one table).
    add_flags(p, GatewayConfig, names=UP_GATEWAY_SETTINGS, only_given=False)
    p.add_argument("--talker-replicas", type=int, default=1)
    p.add_argument("--code2wav-replicas", type=int, default=1)
    p.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=STAGE_DEFAULTS.prefill_chunk,
        help="the thinker's and talkers' prompt positions prefilled per step (see serve --prefill-chunk)",
    )
    p.add_argument(
        "--prefix-cache-gib",
        type=non_negative_gib,
        default=STAGE_DEFAULTS.prefix_cache_gib,
        help="the thinker's and each talker's prefix cache, in GiB (see serve thinker "
        "--prefix-cache-gib; default: half of each one's KV cache; 0: off)",
    )
    p.add_argument(
        "--thinker-backend",
        choices=THINKER_BACKEND.choices,
        default=THINKER_BACKEND.default,
        help="the thinker's engine (see serve thinker --backend); vllm runs it with --vllm-python",
    )
    p.add_argument(
        "--thinker-nice",
        type=nice_value,
        default=DEFAULT_THINKER_NICE,
        help="the thinker's CPU priority (serve --nice): on shared cores the audio stages and the "
        "gateway go first while the thinker, far ahead of them, takes what is left (0: equal; "
        f"default: {DEFAULT_THINKER_NICE})",
    )
    # The gateway's admission flags, named and meant as in `serve gateway` (docs/serving.md "Admission"):
    # `--audio-hold` parses to the gateway's default (start_stack's `audio_hold`), the rest to None
    # (not given: the gateway's default).
    add_flags(p, GatewayConfig, names=("audio_hold",), only_given=False)
    add_flags(p, GatewayConfig, names=ADMISSION_SETTINGS)
    # Handed to all four processes (each exports its own spans: omnistream/service/tracing.py).
    add_endpoint_argument(p, ", from every service `up` starts")
    p.add_argument(
        "--vllm-python",
        default=None,
        help=f"the interpreter of the vLLM environment (default: ${VLLM_PYTHON_ENV}, else "
        ".venv-vllm/bin/python of this source tree, which `make setup-vllm` builds)",
    )


def admission_flags(args: argparse.Namespace) -> list[str]:
    """`serve gateway` flags for the admission settings given to `up` (none: the gateway's defaults)."""
    return as_flags({name: getattr(args, name) for name in ADMISSION_SETTINGS}, GatewayConfig)


def wait_ready(gateway: ServiceProcess, timeout: float = 60.0, cancel: threading.Event | None = None) -> None:
    """Poll the gateway's /ready until 200; StartError if it exits first, StartCancelled on `cancel`."""
    host = gateway.connect_host
    url = f"http://{f'[{host}]' if ':' in host else host}:{gateway.http_port}/ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        check_cancel(cancel)
        if gateway.proc.poll() is not None:
            raise StartError(f"gateway exited with {gateway.proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(WAIT_STEP_S)
    raise StartError(f"gateway not ready after {timeout:.0f}s")


def start_stack(
    model: str,
    services: dict[str, ServiceProcess],
    *,
    dtype: str = STAGE_DEFAULTS.dtype,
    device: str = STAGE_DEFAULTS.device,
    devices: dict[str, str] | None = None,
    allow_float64: bool = STAGE_DEFAULTS.allow_float64,
    host: str = GatewayConfig.host,
    http_port: int = 0,
    grpc_port: int = 0,
    max_concurrency: int | None = GatewayConfig.max_concurrency,
    talker_replicas: int = 1,
    code2wav_replicas: int = 1,
    prefill_chunk: int = STAGE_DEFAULTS.prefill_chunk,
    audio_hold: bool = GatewayConfig.audio_hold,
    gateway_flags: Sequence[str] = (),
    cancel: threading.Event | None = None,
    thinker_backend: str = THINKER_BACKEND.default,
    vllm_python_path: str | None = None,
    thinker_nice: int = DEFAULT_THINKER_NICE,
    prefix_cache_gib: float | None = STAGE_DEFAULTS.prefix_cache_gib,
    otlp_traces_endpoint: str | None = None,
) -> ServiceProcess:
    """Start the stages, then the gateway, into `services` (so a caller can stop whatever started).

    `devices` maps a stage to its own device (default: `device`): one GPU per stage, e.g. the
    thinker on cuda:0 and the talker and code2wav on cuda:1. Each stage checks at start that its
    weights and KV cache fit the free memory of its device (omnistream/models/qwen3_omni/memory.py).

    `max_concurrency`: the gateway's cap (None: its limits follow what the stages report they hold).
    `audio_hold`: False starts the gateway with `--no-audio-hold` (docs/serving.md "Admission").
    `gateway_flags`: more `omnistream serve gateway` flags (e.g. `--audio-start-guard 0`).

    `cancel`: once set, the start stops where it is (StartCancelled); what had started is either
    already in `services` or killed by `start_services`.

    `thinker_backend` "vllm": the thinker is `serve thinker --backend vllm`, run by the vLLM
    environment's interpreter (`vllm_python_path`, see `vllm_python`).

    `thinker_nice`: the thinker's `serve --nice` (omnistream/service/cpu_priority.py): the stages
    started here share this machine's cores.

    `prefix_cache_gib`: the thinker's and the talkers' `serve --prefix-cache-gib` (None: their default).

    `otlp_traces_endpoint`: every service's `--otlp-traces-endpoint` (None: the OTEL_* environment,
    which the services inherit, decides).
    """
    devices = devices or {}
    prefill = ["--prefill-chunk", str(prefill_chunk)]
    traced = [] if otlp_traces_endpoint is None else ["--otlp-traces-endpoint", otlp_traces_endpoint]

    def stage_args(stage: str) -> list[str]:
        args = ["serve", stage, "--model", model, "--dtype", dtype, "--device", devices.get(stage, device)]
        args += traced
        return [*args, "--allow-float64"] if allow_float64 else args

    cached = [] if prefix_cache_gib is None else ["--prefix-cache-gib", str(prefix_cache_gib)]
    specs = {"thinker": [*stage_args("thinker"), "--nice", str(thinker_nice), *prefill, *cached]}
    pythons = {}
    if thinker_backend == "vllm":
        specs["thinker"] += ["--backend", "vllm"]
        pythons["thinker"] = vllm_python(vllm_python_path)
    for i in range(talker_replicas):
        specs[f"talker-{i}"] = [*stage_args("talker"), *prefill, *cached]
    for i in range(code2wav_replicas):
        specs[f"code2wav-{i}"] = stage_args("code2wav")
    services.update(start_services(specs, cancel=cancel, pythons=pythons))
    return start_gateway(
        services,
        host=host,
        http_port=http_port,
        grpc_port=grpc_port,
        max_concurrency=max_concurrency,
        audio_hold=audio_hold,
        gateway_flags=[*gateway_flags, *traced],
        cancel=cancel,
    )


STAGES = ("thinker", "talker", "code2wav")


def start_gateway(
    services: dict[str, ServiceProcess],
    *,
    name: str = "gateway",
    host: str = GatewayConfig.host,
    http_port: int = 0,
    grpc_port: int = 0,
    max_concurrency: int | None = GatewayConfig.max_concurrency,
    audio_hold: bool = GatewayConfig.audio_hold,
    gateway_flags: Sequence[str] = (),
    cancel: threading.Event | None = None,
) -> ServiceProcess:
    """A gateway over the stage services already in `services` (named `<stage>` or `<stage>-<i>`),
    added to `services` as `name` and returned once ready. A second one over the same stages
    compares two admission settings on one set of stage processes (`omnistream bench --audio-hold`)."""
    gateway_args = [
        "serve",
        "gateway",
        "--host",
        host,
        "--http-port",
        str(http_port),
        "--grpc-port",
        str(grpc_port),
        *as_flags({"max_concurrency": max_concurrency}, GatewayConfig),
        *([] if audio_hold else ["--no-audio-hold"]),
        *gateway_flags,
    ]
    for stage_name, service in list(services.items()):
        stage = stage_name.split("-")[0]
        if stage in STAGES:
            gateway_args += [f"--{stage}", service.address]
    services.update(start_services({name: gateway_args}, cancel=cancel))
    gateway = services[name]
    wait_ready(gateway, cancel=cancel)
    return gateway


def check_memory(args: argparse.Namespace) -> None:
    """Stages on a GPU: the ones sharing a device must fit its free memory together (each stage
    checks itself too, but they start in parallel and each would see the whole device free)."""
    devices = stage_devices(args)
    if not any(is_accelerator(d) for d in devices.values()):
        return  # the CPU path stays free of torch and transformers imports here
    from omnistream.models.qwen3_omni.checkpoint import load_config
    from omnistream.models.qwen3_omni.memory import check_placement_fits

    counts = {"thinker": 1, "talker": args.talker_replicas, "code2wav": args.code2wav_replicas}
    # Each stage's settings as its `serve` builds them from the flags `up` gives it.
    settings = {stage: build(STAGE_SETTINGS[stage], args, device=devices[stage]) for stage in counts}
    placement = [(stage, settings[stage]) for stage, count in counts.items() for _ in range(count)]
    # `up` starts its stages with the serving defaults of --max-batch and --max-model-len.
    thinker = settings["thinker"]
    check_placement_fits(load_config(args.model), placement, thinker.max_batch, thinker.max_model_len)


def busy_port(host: str, http_port: int, grpc_port: int) -> str | None:
    """The one-line error for the first of the gateway's ports already taken, or None."""
    for port in (http_port, grpc_port):
        if port_in_use(host, port):
            return in_use_message(port, "--http-port/--grpc-port", who="omnistream up")
    return None


def stop_stack(services: dict[str, ServiceProcess]) -> None:
    """Gateway first (it finishes its streams, which need the stages), then every stage at once."""
    gateway = [s for name, s in services.items() if name == "gateway"]
    stop_services(gateway, DRAIN_TIMEOUT_S)
    stop_services([s for name, s in services.items() if name != "gateway"], DRAIN_TIMEOUT_S)


def _say(text: str, file: TextIO | None = None) -> None:
    """Print, unless the terminal is gone (SIGHUP): stopping must not fail on a closed tty."""
    with contextlib.suppress(OSError):
        print(text, file=file or sys.stdout, flush=True)


def _supervise(services: dict[str, ServiceProcess], stop: threading.Event) -> int:
    """Until a stop signal (0) or until a service exits on its own (1)."""
    while not stop.is_set():
        for name, service in services.items():
            if service.proc.poll() is not None:
                _say(f"omnistream up: {name} exited with {service.proc.returncode}; stopping", sys.stderr)
                return 1
        stop.wait(0.5)
    return 0


def run_up(args: argparse.Namespace) -> int:
    stop = threading.Event()
    for sig in STOP_SIGNALS:  # installed first: a signal at any later point stops what was started
        signal.signal(sig, lambda *_: stop.set())
    busy = busy_port(args.host, args.http_port, args.grpc_port)
    if busy:
        _say(f"omnistream up: {busy}", sys.stderr)
        return 1
    from omnistream.request.errors import OmniError  # grpc: not at import time (the CLI parses first)

    try:
        check_memory(args)
    except OmniError as exc:
        _say(f"omnistream up: {exc.message}", sys.stderr)
        return 1
    services: dict[str, ServiceProcess] = {}
    try:
        gateway = start_stack(
            args.model,
            services,
            dtype=args.dtype,
            device=args.device,
            devices=stage_devices(args),
            allow_float64=args.allow_float64,
            host=args.host,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            max_concurrency=args.max_concurrency,
            talker_replicas=args.talker_replicas,
            code2wav_replicas=args.code2wav_replicas,
            prefill_chunk=args.prefill_chunk,
            audio_hold=args.audio_hold,
            gateway_flags=admission_flags(args),
            cancel=stop,
            thinker_backend=args.thinker_backend,
            vllm_python_path=args.vllm_python,
            thinker_nice=args.thinker_nice,
            prefix_cache_gib=args.prefix_cache_gib,
            otlp_traces_endpoint=args.otlp_traces_endpoint,
        )
        _say(usage_text(args.host, gateway.http_port, gateway.port))
        return _supervise(services, stop)
    except StartCancelled:
        return 0
    except (StartError, TimeoutError) as exc:  # the failing service printed its own reason above
        _say(f"omnistream up: {exc}; stopped everything", sys.stderr)
        return 1
    finally:
        stop_stack(services)
